"""One bounded CPU-list parser (hosts.engines.cpulist) for the panel's forms and API, the
launch rules, the advisor's host facts and the host agent: `0-999999999` once made the panel
build a set of a billion CPUs (16 GB in about a minute), and the agent would have too."""

from __future__ import annotations

import pytest

from changes.forms_launch import cpu_list, cpu_set
from changes.services.diagnosis_facts import _cpu_list
from hosts.agent.host import format_cpu_list, parse_cpu_list
from hosts.engines import cpulist
from hosts.engines.launch import Placement


def test_lists_parse_in_the_order_written_and_format_back():
    assert cpulist.parse("0-3,8") == [0, 1, 2, 3, 8]
    assert cpulist.parse(" 8, 0-1 ") == [8, 0, 1]
    assert cpulist.parse("0-8191") == list(range(8192))
    assert cpulist.format_list([9, 0, 1, 2, 3, 8, 3]) == "0-3,8-9"
    assert cpulist.format_list([]) == ""


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0-999999999", "expected a CPU list"),  # more digits than a CPU number has
        ("0-999999", "CPU 999999 in '0-999999' is beyond the largest CPU number Linux supports"),
        ("8192", "beyond the largest CPU number"),
        ("0-8191,0-8191", "more than 8192 CPUs"),
        ("0," * 3000 + "1", "characters (at most 4096)"),
        ("7-3", "CPU range '7-3' runs backwards"),
        ("0-15;rm", "expected a CPU list like 0-15,32-47"),
        ("", "expected a CPU list"),
        ("0,,1", "expected a CPU list"),
    ],
)
def test_what_is_not_a_list_within_the_limits_is_refused_by_name(text, words):
    with pytest.raises(cpulist.CpuListError, match=None) as raised:
        cpulist.parse(text)
    assert words in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_every_caller_refuses_a_huge_range_without_expanding_it():
    huge = "0-999999,4-999998"
    assert "beyond the largest CPU number" in Placement(cpus=huge).problems()["placement.cpus"]
    assert cpu_set(huge) == set() and cpu_set("0-3") == {0, 1, 2, 3}
    assert cpu_list({3, 0, 1, 2}) == "0-3"
    assert _cpu_list(huge) is None and _cpu_list("0-1") == (0, 1) and _cpu_list("") == ()
    assert _cpu_list(list(range(9000))) is None and _cpu_list([0, "x"]) is None
    with pytest.raises(ValueError, match="beyond the largest CPU number"):
        parse_cpu_list(huge)
    assert parse_cpu_list("0-2\n") == [0, 1, 2] and parse_cpu_list("") == []
    assert format_cpu_list([1, 0]) == "0-1"
