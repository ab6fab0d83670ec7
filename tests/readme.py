"""Running README.md's shell blocks as written, as a newcomer would paste them.

Only the ports change: the README's fixed ports become free ones (tests never use fixed ports), in
the block and in the example configs, which are copied into a scratch directory laid out like a
checkout. The block runs in bash with `set -euo pipefail` in its own process group, and that whole
group (background servers included) is stopped afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from testkit.procs import wait_gone

ROOT = Path(__file__).resolve().parents[1]
README_PORTS = ("8080", "9101", "9102")


def readme_block(heading: str, index: int = 0, language: str = "bash") -> str:
    """The `index`-th ```bash (or other `language`) block of the README section under `heading`."""
    blocks: list[list[str]] = []
    in_section = in_fence = capturing = False
    for line in (ROOT / "README.md").read_text().splitlines(keepends=True):
        if line.startswith("```"):
            in_fence = not in_fence
            # Only the wanted language: a later ```yaml or ```python block is not part of it.
            capturing = in_section and in_fence and line.strip() == f"```{language}"
            if capturing:
                blocks.append([])
            continue
        if not in_fence and re.match(r"#+ ", line):
            if in_section:
                break
            in_section = line.split(" ", 1)[1].strip() == heading
        elif capturing:
            blocks[-1].append(line)
    assert len(blocks) > index, f"no {language} block {index} under {heading!r} in README.md"
    return "".join(blocks[index])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _group(pgid: int) -> set[int]:
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.add(int(stat.parent.name))
    return members


def run_block(block: str, workdir: Path, timeout_s: float = 120.0) -> Ran:
    """Run `block` in `workdir` (a copy of deploy/, policies/ and eval/ examples with free ports)."""
    ports = {port: str(free_port()) for port in README_PORTS}
    for folder in ("deploy/examples", "policies/examples", "eval/examples"):
        shutil.copytree(ROOT / folder, workdir / folder, dirs_exist_ok=True)
    for config in (workdir / "deploy/examples").glob("*.yaml"):
        config.write_text(_with_ports(config.read_text(), ports))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("GATEWAY_ADMIN_KEY", None)  # the block must set up everything it needs
    # Files, not pipes: servers the block leaves in the background would hold a pipe open.
    with open(workdir / ".stdout", "w+") as stdout, open(workdir / ".stderr", "w+") as stderr:
        process = subprocess.Popen(
            ["bash", "-c", "set -euo pipefail\n" + _with_ports(block, ports)],
            cwd=workdir,
            env=env,
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        try:
            process.wait(timeout_s)
        finally:
            members = _group(process.pid)
            if members:
                os.killpg(process.pid, signal.SIGTERM)
            process.kill()
            process.wait()
            wait_gone(members)
        stdout.seek(0)
        stderr.seek(0)
        return Ran(process.returncode, stdout.read(), stderr.read())


def _with_ports(text: str, ports: dict[str, str]) -> str:
    return re.sub(r"\b(" + "|".join(ports) + r")\b", lambda m: ports[m.group(1)], text)
