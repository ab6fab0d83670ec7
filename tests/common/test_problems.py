from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from common.problems import key_path, pydantic_message


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str

    @field_validator("name")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class Doc(BaseModel):
    items: list[Item]


def errors_of(data: object) -> list[tuple[str, str]]:
    try:
        Doc.model_validate(data)
    except ValidationError as error:
        return [(key_path(e["loc"]), pydantic_message(e)) for e in error.errors()]
    raise AssertionError("valid")


def test_indexes_are_bracketed_and_keys_dotted() -> None:
    assert key_path(("cases", 0, "assertions", 1, "pattern")) == "cases[0].assertions[1].pattern"
    assert key_path((0, "name")) == "[0].name"


def test_the_document_itself_is_the_empty_path() -> None:
    assert key_path(()) == ""


def test_skipped_parts_are_left_out() -> None:
    assert key_path(("store", "redis", "url"), skip={"redis"}.__contains__) == "store.url"


def test_pydantic_wording_is_dropped_from_messages() -> None:
    assert errors_of({"items": [{"name": " "}, {"name": "a", "extra": 1}]}) == [
        ("items[0].name", "must not be blank"),
        ("items[1].extra", "unknown key"),
    ]
