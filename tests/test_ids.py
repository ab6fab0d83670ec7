"""gateway/ids.py: random ids from a pool of the OS's random bytes."""

from __future__ import annotations

import os
import re

from gateway.ids import RandomIds


def test_ids_are_hex_of_the_asked_length_and_never_repeat() -> None:
    ids = RandomIds(pool_bytes=64)  # small: the pool is refilled many times
    made = [ids.hex() for _ in range(2000)] + [ids.hex(12) for _ in range(2000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", made_id) for made_id in made[:2000])
    assert all(re.fullmatch(r"[0-9a-f]{24}", made_id) for made_id in made[2000:])
    assert len(set(made)) == len(made)


def test_an_id_longer_than_the_pool_is_still_whole() -> None:
    assert re.fullmatch(r"[0-9a-f]{200}", RandomIds(pool_bytes=16).hex(100))


def test_a_forked_child_never_hands_out_its_parents_next_ids() -> None:
    ids = RandomIds()
    ids.hex()  # the pool is filled: without the fork hook the child would continue from here
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(reader)
        os.write(writer, ids.hex().encode())
        os._exit(0)
    os.close(writer)
    try:
        with os.fdopen(reader, "rb") as from_child:
            child_id = from_child.read().decode()
    finally:
        os.waitpid(pid, 0)
    assert re.fullmatch(r"[0-9a-f]{32}", child_id)
    assert child_id != ids.hex()
