"""The compute section of a latency profile (``hicache.profile``): reading a version-1 file
into version 2's constants, and the validation of a Profile and of the file's fields, message
by message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hicache.profile import (
    V1_NOTE,
    LinkParams,
    Profile,
    load_profile,
    profile_from_dict,
    profile_to_dict,
)

SRC = "p.json"


@pytest.fixture(scope="module")
def h100() -> Profile:
    return load_profile(None, "h100-sxm", "pcie5-x16")


def _v1(h100: Profile) -> dict[str, Any]:
    data = profile_to_dict(h100)
    data["version"] = 1
    data["compute"] = {"mfu": 0.5, "prefill_overhead_s": 0.002, "attn_efficiency": 1.0,
                       "decode_hbm_efficiency": 0.7, "decode_overhead_s": 0.003}  # fmt: skip
    return data


OVERHEADS = ("prefill_forward_s", "decode_forward_s", "request_s", "sampling_s", "hicache_check_s")


def test_version_1_compute_is_converted_field_by_field(h100: Profile) -> None:
    """Links and decode_hbm_efficiency kept, gemm_scale 1, the overheads of the shipped
    default for the profile's GPU and link (h100-sxm + pcie5-x16: 1.5 ms, 0.2 ms, 0.1 ms,
    0.1 ms, 0.15 ms), or 0 where nothing is shipped."""
    got = profile_from_dict(_v1(h100), SRC)
    assert (got.gemm_scale, got.decode_hbm_efficiency) == (1.0, 0.7)
    assert [getattr(got, k) for k in OVERHEADS] == [1.5e-3, 2e-4, 1e-4, 1e-4, 1.5e-4]
    assert got.provenance == {**h100.provenance, "converted": V1_NOTE}
    assert got.links == h100.links and got.measured is False
    other = profile_from_dict(_v1(h100) | {"gpu": "b200"}, SRC)
    assert [getattr(other, k) for k in OVERHEADS] == [0.0] * 5
    assert (other.gemm_scale, other.decode_hbm_efficiency) == (1.0, 0.7)


def test_version_1_compute_errors_name_the_source_and_key(h100: Profile) -> None:
    data = _v1(h100)
    data["compute"]["gemm_scale"] = 1.0
    with pytest.raises(ValueError, match=(
        r"^p\.json: compute\.gemm_scale: unknown key; allowed: mfu, prefill_overhead_s, "
        r"attn_efficiency, decode_hbm_efficiency, decode_overhead_s$"
    )):  # fmt: skip
        profile_from_dict(data, SRC)
    data = _v1(h100)
    data["compute"]["mfu"] = "x"
    with pytest.raises(ValueError, match=r"^p\.json: compute\.mfu: expected a finite number"):
        profile_from_dict(data, SRC)


def _edited(h100: Profile, edit: Any) -> dict[str, Any]:
    data = profile_to_dict(h100)
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d.update(colour=1),
            "colour: unknown key; allowed: version, gpu, link, "
            "measured, provenance, links, compute",
        ),
        (lambda d: d.pop("gpu"), "gpu: missing"),
        (lambda d: d.update(gpu=""), "gpu: expected a non-empty string"),
        (lambda d: d.update(link=5), "link: expected a non-empty string"),
        (lambda d: d.update(provenance={"source": 1}), "provenance: expected an object of strings"),
        (lambda d: d.update(provenance=[]), "provenance: expected an object of strings"),
        (lambda d: d.update(links=[]), "links: expected an object"),
        (
            lambda d: d["links"]["kernel"]["d2h"].update(alpha_s="x"),
            "links.kernel.d2h.alpha_s: expected a finite number, got 'x'",
        ),
        (
            lambda d: d["links"]["kernel"]["d2h"].update(beta_Bps=0),
            "links.kernel.d2h.beta_Bps must be > 0, got 0.0",
        ),
    ],
)
def test_file_errors_are_exact(h100: Profile, edit: Any, message: str) -> None:
    with pytest.raises(ValueError) as e:
        profile_from_dict(_edited(h100, edit), SRC)
    assert str(e.value) == f"{SRC}: {message}"


def test_profile_links_are_checked(h100: Profile) -> None:
    links = h100.links
    with pytest.raises(ValueError, match=r"^links\.kernel\.d2h: missing$"):
        dataclasses.replace(h100, links={"direct": links["direct"]})
    with pytest.raises(ValueError, match=r"^links\.rdma: unknown backend; choices: \('kernel'"):
        dataclasses.replace(h100, links={**links, "rdma": links["direct"]})
    with pytest.raises(ValueError, match=r"^links\.kernel\.up: unknown direction; choices: \("):
        extra = {**links["kernel"], "up": links["kernel"]["d2h"]}
        dataclasses.replace(h100, links={**links, "kernel": extra})
    with pytest.raises(ValueError, match=r"^unknown io backend 'rdma'; choices: kernel, direct$"):
        h100.link("rdma", "h2d")
    with pytest.raises(ValueError, match=r"^unknown direction 'up'; choices: d2h, h2d$"):
        h100.link("kernel", "up")


def test_profile_compute_bounds_are_inclusive_at_the_top(h100: Profile) -> None:
    top = dataclasses.replace(h100, gemm_scale=100.0, decode_hbm_efficiency=1.0)
    assert (top.gemm_scale, top.decode_hbm_efficiency) == (100.0, 1.0)
    with pytest.raises(ValueError, match=r"^compute\.gemm_scale must be in \(0, 100\], got 100.5$"):
        dataclasses.replace(h100, gemm_scale=100.5)
    with pytest.raises(
        ValueError, match=r"^compute\.decode_hbm_efficiency must be in \(0, 1\], got 1.5$"
    ):
        dataclasses.replace(h100, decode_hbm_efficiency=1.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha_s": float("nan")}, "alpha_s must be finite, got nan"),
        ({"alpha_s": -1.0}, "alpha_s must be >= 0, got -1.0"),
        ({"beta_Bps": 0.0}, "beta_Bps must be > 0, got 0.0"),
        ({"gamma_s": -1.0}, "gamma_s must be >= 0, got -1.0"),
    ],
)
def test_link_params_messages(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as e:
        LinkParams(**({"alpha_s": 0.0, "beta_Bps": 1.0} | kwargs))
    assert str(e.value) == message


def test_a_slow_link_is_still_a_link() -> None:
    assert LinkParams(alpha_s=0.0, beta_Bps=0.5).beta_Bps == 0.5  # under 1 B/s but > 0


def test_errors_without_a_source_say_profile() -> None:
    with pytest.raises(ValueError, match=r"^<profile>: version: missing$"):
        profile_from_dict({})
