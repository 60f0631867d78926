"""The upgrade comparison's table and difference lines (``studies.upgrade``)."""

from __future__ import annotations

from studies.upgrade import big_differences, format_upgrade, upgrade_html


def row(setup: str, version: str, host: float, ttft: float = 1.0) -> dict[str, object]:
    return {"setup": setup, "sglang_version": version, "hit_rate": 0.1 + host,
            "device_hit_rate": 0.1, "host_hit_rate": host, "ttft_mean_s": ttft,
            "ttft_p90_s": 2 * ttft}  # fmt: skip


def test_a_tier_that_loses_most_of_its_hits_is_a_big_difference_with_its_cause() -> None:
    old = [row("write_through_selective", "0.5.14", 0.005)]
    new = [row("write_through_selective", "0.5.23", 0.0012)]
    (line,) = big_differences(old, new)
    assert line.startswith("write_through_selective: host hit rate 0.50% (0.5.14) -> 0.12%")
    assert "-0.4 points" in line and "watermark" in line


def test_small_moves_give_the_no_difference_line_and_ttft_moves_are_named() -> None:
    old = [row("write_through", "0.5.14", 0.10, 1.00)]
    assert big_differences(old, [row("write_through", "0.5.23", 0.102, 1.01)])[0].startswith(
        "no difference"
    )
    lines = big_differences(old, [row("write_through", "0.5.23", 0.10, 1.20)])
    assert [x.split(" ")[1:3] for x in lines] == [["TTFT", "mean"], ["TTFT", "p90"]]
    assert all("+20%" in x for x in lines)


def test_table_pairs_each_setup_with_its_twin_and_html_escapes() -> None:
    old = [row("write_back", "0.5.14", 0.01), row("<b>", "0.5.14", 0.0)]
    new = [row("write_back", "0.5.23", 0.02)]
    text = format_upgrade(old, new)
    assert text.splitlines()[1].split()[:2] == ["write_back", "0.5.14"]
    assert text.splitlines()[2].split()[:2] == ["write_back", "0.5.23"]
    assert "<b>" not in upgrade_html(old, new) and "write_back" in upgrade_html(old, new)
