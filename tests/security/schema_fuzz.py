"""One schemathesis run over every operation of an OpenAPI schema, in both generation modes (cases
that fit the schema and cases that break it): what the admin API's and the API surfaces' fuzz
tests share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

# Imported now, while the tests are collected: schemathesis loads its OpenAPI modules on first use,
# and pytest rewrites them (ast.parse) as they load. Mid-test, with the tests' own threads about,
# that parse once failed in CI with "AST constructor recursion depth mismatch" (CPython's AST
# converter and its recursion check, python/cpython#106905, seen rarely and with threads, as here
# on 3.11.7); at collection nothing else runs.
import schemathesis.specs.openapi.schemas  # noqa: F401
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode


@dataclass
class SchemaFuzz:
    operations: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(self.statuses.values())

    def figures(self, name: str) -> str:
        return f"schemathesis {name}: {self.operations} operations, {self.cases} cases, {dict(self.statuses)}"


def fuzz_schema(schema: Any, cases_per_operation: int, send: Callable[[Any], Iterable[httpx.Response]]) -> SchemaFuzz:
    """`send(case)` sends a generated case (as it is, or in several variants: keys, ids) and returns
    the answers; every 5xx is kept with the case that caused it."""
    result = SchemaFuzz()
    operations = [found.ok() for found in schema.get_all_operations()]
    result.operations = len(operations)
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=cases_per_operation,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                for response in send(case):
                    result.statuses[response.status_code] += 1
                    if response.status_code >= 500:
                        result.server_errors.append(f"{case.method} {case.formatted_path}: {response.text[:300]}")

            try:
                run()
            except Exception as error:  # schemathesis cannot build cases for this operation and mode
                if "Unsatisfiable" not in type(error).__name__:
                    raise
    return result
