from __future__ import annotations

from pathlib import Path

import pytest

from sim.faults import FaultError, Faults, PositionalFault, parse_faults
from sim.profile import ProfileError, SimProfile, load_profile


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("status=503", Faults(status=503)),
        ("status=429,retry_after=1", Faults(status=429, retry_after=1.0)),
        ("cut_after=5", Faults(cut_after=5)),
        ("stall_after=3,slow=1.5", Faults(stall_after=3, slow=1.5)),
        (" error_rate = 0.25 , inband_error_after=2 ", Faults(error_rate=0.25, inband_error_after=2)),
        ("malformed-after=0", Faults(malformed_after=0)),
        ("keepalive_after=2", Faults(keepalive_after=2)),
        ("drip_health", Faults(drip_health=True)),
        ("drip_health=false,keepalive_after=0", Faults(keepalive_after=0)),
        ("", Faults()),
        ("none", Faults()),
        ("status=none", Faults()),
    ],
)
def test_fault_header_parses_comma_separated_key_values(header: str, expected: Faults) -> None:
    assert parse_faults(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "status",
        "keepalive_after",
        "drip_health=maybe",
        "bogus=1",
        "status=abc",
        "status=200",
        "slow=-1",
        "error_rate=2",
        "cut_after=-3",
    ],
)
def test_bad_fault_header_is_rejected(header: str) -> None:
    with pytest.raises(FaultError):
        parse_faults(header)


def test_earliest_positional_fault_wins_and_cut_beats_stall_on_a_tie() -> None:
    assert Faults().first_positional() is None
    assert Faults(stall_after=3, malformed_after=1).first_positional() == (1, PositionalFault.MALFORMED)
    assert Faults(stall_after=2, cut_after=2).first_positional() == (2, PositionalFault.ABORT)


def test_profile_defaults_match_the_documented_ones() -> None:
    profile = SimProfile()
    assert (profile.ttft_ms, profile.tpot_ms, profile.jitter) == (40, 12, 0.1)
    assert profile.model_ids == ["sim-model"]
    assert profile.faults == Faults()


def test_profile_file_values_are_overridden_by_flags(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("ttft_ms: 100\ntpot_ms: 20\nseed: 7\nmodel_ids: [a, b]\nfaults:\n  slow: 2\n  error_rate: 0.1\n")
    profile = load_profile(path, tpot_ms=5, ttft_ms=None, faults="status=503")
    assert profile.ttft_ms == 100
    assert profile.tpot_ms == 5
    assert profile.seed == 7
    assert profile.model_ids == ["a", "b"]
    assert profile.faults == Faults(status=503, slow=2, error_rate=0.1)


def test_faults_instance_override_replaces_the_file_faults(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("faults: {slow: 2}\n")
    assert load_profile(path, faults=Faults(cut_after=1)).faults == Faults(cut_after=1)


@pytest.mark.parametrize("text", ["[1, 2]", "ttft_ms: fast", "unknown_field: 1", "faults: {bogus: 1}"])
def test_bad_profile_file_is_reported(tmp_path: Path, text: str) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError):
        load_profile(path)


def test_missing_profile_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ProfileError):
        load_profile(tmp_path / "absent.yaml")
