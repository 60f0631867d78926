"""Servers (issue 13 item 3): how tensor-parallel ranks share uplinks and socket memory, and
that the simulator's copies slow down when they do."""

from __future__ import annotations

import math

import pytest

from hicache.servers import DEFAULT_SERVER, SERVERS, ServerSpec, get_server, rank_link_share


def test_share_by_hand() -> None:
    s = ServerSpec("x", gpus=8, gpus_per_uplink=2, uplink_Bps=50e9, sockets=2,
                   socket_mem_Bps=120e9, source="test")  # fmt: skip
    assert rank_link_share(s, 50e9, 1) == 1.0  # alone on its uplink and socket
    assert rank_link_share(s, 50e9, 2) == pytest.approx(0.5)  # two share one uplink
    assert rank_link_share(s, 50e9, 4) == pytest.approx(0.5)  # 120/4 = 30 > 25 per rank
    assert rank_link_share(s, 50e9, 8) == pytest.approx(0.5)
    mem_bound = ServerSpec("y", 8, 1, math.inf, 2, 120e9, "test")
    assert rank_link_share(mem_bound, 50e9, 4) == pytest.approx(30e9 / 50e9)
    with pytest.raises(ValueError, match=r"tp=16 needs more GPUs than server 'x' has \(8\)"):
        rank_link_share(s, 50e9, 16)
    with pytest.raises(ValueError, match=r"do not split evenly"):
        ServerSpec("z", 8, 3, 1.0, 2, 1.0, "test")


def test_presets_have_sources_and_gpus_have_servers() -> None:
    from hicache.hardware import GPUS

    for s in SERVERS.values():
        assert len(s.source) > 40, s.name
    assert set(DEFAULT_SERVER) == set(GPUS)
    assert get_server("dgx-h100").gpus == 8
    with pytest.raises(ValueError, match=r"unknown server 'dgx-b200'; choices: "):
        get_server("dgx-b200")
    # DGX H100: each GPU behind its own switch, so only socket memory is shared: a TP8 rank
    # keeps nearly all of a 50 GB/s link; DGX A100 pairs GPUs behind one Gen4 uplink
    assert rank_link_share(get_server("dgx-h100"), 50e9, 8) == 1.0
    assert rank_link_share(get_server("dgx-h100"), 53e9, 8) == pytest.approx(0.996, abs=0.002)
    assert rank_link_share(get_server("dgx-a100"), 23e9, 8) == pytest.approx(12.5 / 23)


def test_a_tp8_run_shows_the_shared_link() -> None:
    """All ranks load at once: on a server whose GPUs pair behind one uplink, each rank's
    host->device bandwidth halves, and so does the bandwidth term of every load."""
    from hicache.config import load_config
    from sim.costs import build_costs

    base = ["model.name=llama-3-70b", "model.tp=8"]
    own = build_costs(load_config(None, [*base, "gpu.server=single"]))
    paired = build_costs(load_config(None, [*base, "gpu.server=hgx-h100-paired"]))
    assert paired.h2d.beta_Bps == pytest.approx(own.h2d.beta_Bps * 26.5 / 50)
    nbytes = 128 * own.bytes_per_page
    t_own, t_paired = own.op_time("load", nbytes, 1), paired.op_time("load", nbytes, 1)
    assert t_paired - t_own == pytest.approx(nbytes / paired.h2d.beta_Bps - nbytes / 50e9)
    # one GPU: nothing to share, whatever the server
    one = build_costs(load_config(None, ["gpu.server=hgx-h100-paired"]))
    assert one.h2d.beta_Bps == 50e9
    with pytest.raises(Exception, match=r"model.tp.*needs more GPUs"):
        load_config(None, ["model.name=qwen3-235b-a22b", "model.tp=16"])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 1, 1.0, 1, 1.0), r"^server x: gpus, gpus_per_uplink, sockets must be >= 1$"),
        ((2, 0, 1.0, 1, 1.0), r"^server x: gpus, gpus_per_uplink, sockets must be >= 1$"),
        ((2, 1, 1.0, 0, 1.0), r"^server x: gpus, gpus_per_uplink, sockets must be >= 1$"),
        ((2, 1, 0.0, 1, 1.0), r"^server x: bandwidths must be > 0$"),
        ((2, 1, 1.0, 1, 0.0), r"^server x: bandwidths must be > 0$"),
        ((8, 3, 1.0, 2, 1.0), r"^server x: 8 GPUs do not split evenly into 2 sockets and uplinks"),
    ],
)
def test_server_spec_rejects_each_bad_field(
    args: tuple[int, int, float, int, float], match: str
) -> None:
    gpus, per_uplink, uplink, sockets, mem = args
    with pytest.raises(ValueError, match=match):
        ServerSpec("x", gpus, per_uplink, uplink, sockets, mem, "test")


def test_the_smallest_server_is_valid() -> None:
    # one GPU on one socket, bandwidths under 1 B/s: odd but positive, so allowed;
    # the rank is limited by the 0.5 B/s uplink: 0.5 / 2 = 0.25 of its link
    tiny = ServerSpec("t", gpus=1, gpus_per_uplink=1, uplink_Bps=0.5, sockets=1,
                      socket_mem_Bps=0.75, source="test")  # fmt: skip
    assert rank_link_share(tiny, 2.0, 1) == 0.25


def test_share_argument_errors_are_named() -> None:
    s = get_server("dgx-a100")
    with pytest.raises(ValueError, match=r"^tp must be >= 1, got 0$"):
        rank_link_share(s, 50e9, 0)
    with pytest.raises(ValueError, match=r"\(8\); choose a larger server preset$"):
        rank_link_share(s, 50e9, 9)
    with pytest.raises(ValueError, match=r"^link bandwidth must be > 0, got 0$"):
        rank_link_share(s, 0, 8)
    with pytest.raises(
        ValueError,
        match=r"choices: dgx-a100, dgx-h100, dgx-h200, hgx-h100-paired, single$",
    ):
        get_server("nope")


def test_both_ways_eta_is_capped_by_the_socket_share() -> None:
    from hicache.servers import both_ways_eta

    # 4 GPUs per socket, 120 GB/s usable DRAM: at tp 4 (and 8) 30 GB/s per rank, under the
    # 25 + 25 GB/s both directions want: eta <= 30 / 50 = 0.6
    s = ServerSpec("y", 8, 1, math.inf, 2, 120e9, "test")
    assert both_ways_eta(s, 25e9, 25e9, 4, 0.8) == pytest.approx(0.6)
    assert both_ways_eta(s, 25e9, 25e9, 8, 0.8) == pytest.approx(0.6)
    # tp 2: 60 GB/s per rank, 60 / 50 = 1.2 > eta: eta stays
    assert both_ways_eta(s, 25e9, 25e9, 2, 0.8) == 0.8
    # one direction faster: 30 / (40 + 10) = 0.6 still (the sum counts)
    assert both_ways_eta(s, 40e9, 10e9, 4, 0.9) == pytest.approx(0.6)
