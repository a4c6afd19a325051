"""The user-facing pages keep to one source for every figure, and speak of the product, not of its making.

README's performance table is the one docs/hooks.py reads from the result files it names (the Latest
results page shows the same figures, generated at every build); no page speaks of a work session, an
issue or a note, which mean nothing to a user.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
BEGIN, END = "<!-- performance: generated from benchmarks/results/ -->", "<!-- end of performance -->"
#: how lab notes speak: of the session they were written in, of issue numbers, of notes
LAB_NOTES = re.compile(
    r"\b(?:this|that|our|last|previous|next|an earlier|a later|another) session\b"
    r"|\bsession(?:'s)? notes?\b|\bnotes? of (?:this|the|that) session\b"
    r"|\bissues? #?\d+|\b(?:see|in) the issues?\b|\bfiled by\b",
    re.IGNORECASE)


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readmes_performance_table_is_the_one_its_result_files_give():
    readme = (ROOT / "README.md").read_text()
    assert BEGIN in readme and END in readme, "README.md lost the markers of its performance table"
    table = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == hooks().readme_table().strip(), (
        "README.md's performance table differs from its result files; paste docs/hooks.py readme_table():\n"
        + hooks().readme_table())


def test_every_result_file_the_figures_name_exists():
    h = hooks()
    named = [path for _, _, lines in h.FIGURES for _, _, path in lines] + [h.CAPACITY_RESULT, h.HA_RESULT]
    assert all((ROOT / "benchmarks" / "results" / path).is_file() for path in named), named


def test_a_changed_figure_fails_the_comparison(tmp_path, monkeypatch):
    """The check has teeth: a result file that says something else gives another table."""
    h = hooks()
    before = h.readme_table()
    results = tmp_path / "results"
    for _, _, lines in h.FIGURES:
        for _, _, path in lines:
            (results / path).parent.mkdir(parents=True, exist_ok=True)
            (results / path).write_bytes((h.RESULTS / path).read_bytes())
    first = h.FIGURES[0][2][0][2]
    (results / first).write_text((results / first).read_text().replace('"p999": 90.223', '"p999": 91.5', 1))
    monkeypatch.setattr(h, "RESULTS", results)
    assert h.readme_table() != before


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_a_session_or_an_issue(page):
    found = [(n, line.strip()) for n, line in enumerate(page.read_text().splitlines(), 1) if LAB_NOTES.search(line)]
    assert not found, f"{page.relative_to(ROOT)} speaks of how it was made, not of the product: {found}"


def test_the_lab_note_check_finds_lab_notes():
    for text in ("After this session's restructure", "the note of this session lists it as open",
                 "Issue 16's untried levers", "the publish loop (issue 24)"):
        assert LAB_NOTES.search(text), text
    for text in ("a session cookie", "the session timeout", "in session mode", "its sessions commit",
                 "an already running Spark session", "a session advisory lock"):
        assert not LAB_NOTES.search(text), text


def test_every_path_the_readme_names_is_in_the_repository():
    """The README speaks from the repository's root: a folder or file it names in backticks is there (the
    stack's own `.chronos/`, made by `chronos up`, apart)."""
    named = re.findall(r"`([A-Za-z_][\w.-]*/[^`\s]*)`", (ROOT / "README.md").read_text())
    assert named and "monitoring/" in named, named
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"README.md names paths the repository does not have: {missing}"


def test_the_production_pages_name_this_release_and_the_one_before():
    """The install and upgrade pages name the releases once, in the variables their blocks use (RELEASE,
    PREVIOUS), and the fleet runs the blocks as written: they must be this checkout's release and the
    changelog's previous one."""
    from kits.fleet.install import INSTALL_PAGE, UPGRADE_PAGE, page_blocks, previous_release
    from chronos import __version__
    (install,) = page_blocks(INSTALL_PAGE, "release")
    (upgrade,) = page_blocks(UPGRADE_PAGE, "upgrade releases")
    assert re.search(rf"^RELEASE={re.escape(__version__)}\b", install, re.M), install
    assert re.search(rf"^RELEASE={re.escape(__version__)}\b", upgrade, re.M), upgrade
    assert re.search(rf"^PREVIOUS={re.escape(previous_release())}\b", upgrade, re.M), upgrade


def test_the_latest_results_show_each_figure_once():
    """No two lines of the Latest results table read the same figure from the same result file."""
    def figure(read, path: str) -> tuple:
        keywords = tuple(sorted(getattr(read, "keywords", {}).items()))
        return getattr(read, "func", read).__name__, keywords, path
    lines = [figure(read, path) for _, _, rows in hooks().FIGURES for _, read, path in rows]
    assert len(lines) == len(set(lines)), sorted(x for x in lines if lines.count(x) > 1)


def test_the_latest_results_name_the_date_and_code_of_each_run():
    h = hooks()
    page = h.glance_page()
    assert "| date (UTC) | code |" in page
    path = "2026-11-28/cpu-ab/d4ed12f-111-1.json"  # the harness of one checkout ran the processes of another
    assert h._code(path) == "`d4ed12f`" and h._code("2026-11-28/cpu-ab/now-111-1.json") == "`aa1d4f9`"
    assert f"| {h._code(path)} | `{path}` |" in page


def test_the_capacity_page_names_the_indexes_its_run_did_not_measure(tmp_path, monkeypatch):
    h = hooks()
    assert h.schema_indexes()["chronos_messages_due_sliced"] == "migration 20"
    assert "`chronos_messages_due_sliced` (migration 20)" in h.capacity_page("2026-11-26/capacity-1x1x1.json")  # before it
    # the two due indexes it replaced, measured with the schema of their day
    assert "a later migration dropped, which its disk and WAL figures include: `chronos_messages_due` (migration 20)" \
        in h.capacity_page("2026-11-26/capacity-1x1x1.json")
    assert "gained indexes" not in h.capacity_page()  # the run the page shows measured today's schema
    measured = orjson.loads((h.RESULTS / "2026-11-26/capacity-1x1x1.json").read_bytes())
    for name in h.schema_indexes():
        measured["disk"]["bytes_per_million"]["indexes"].setdefault(name, 8192)
    (tmp_path / h.CAPACITY_RESULT).parent.mkdir(parents=True)
    (tmp_path / h.CAPACITY_RESULT).write_bytes(orjson.dumps(measured))
    # the key-search index, measured with the schema of its day, is one an operator builds now (migration 19)
    assert "only where an operator builds them, which its disk and WAL figures include: `chronos_messages_key_hash`" \
        in h.capacity_page("2026-11-28/capacity-1x1x1-key-btree.json")
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    assert "gained indexes" not in h.capacity_page()  # a run of today's schema
    for name in [n for n in measured["disk"]["bytes_per_million"]["indexes"] if n not in h.schema_indexes()]:
        if name != "chronos_messages_pkey":
            del measured["disk"]["bytes_per_million"]["indexes"][name]
    (tmp_path / h.CAPACITY_RESULT).write_bytes(orjson.dumps(measured))
    assert "only where an operator builds them" not in h.capacity_page()


def test_the_peers_comparison_is_read_from_its_result_files():
    table = hooks().compare_table("2026-11-23/compare")
    rows = table.splitlines()[2:]
    assert len(rows) == 8 and rows[0].startswith("| Chronos 1/1/1 | 1,000 |"), table
    assert "| 0.66 (PostgreSQL 0.31) | 0.36 | pass | `56e4b1a` |" in rows[4], rows[4]


def test_the_hot_key_table_is_read_from_its_result_file(tmp_path, monkeypatch):
    h = hooks()
    arms = {f"{i}-{k}": {"first_tenth_batch_ms": 50.0, "total_s": 4.0, "rounds": 4,
                         "last_tenth_batch_ms": 500.0 if (i, k) == ("hash", "hot") else 60.0}
            for i in ("hash", "btree") for k in ("hot", "unique")}
    (tmp_path / "hk.json").write_bytes(orjson.dumps({"rows": 300000, "arms": arms, "code": {"git_commit": "abcdef123"},
                                                  "load_average_1m": 1.5}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    table = h.hot_key_table("hk.json")
    assert "| hash index on `key` (migrations 6-14) | one key for every row | 50 ms | 500 ms | 4.0 s |" in table
    assert "300,000 rows in all" in table and "4 rounds of each arm, code `abcdef1`" in table
    page = h.on_page_markdown("x <!-- generated: hot-key hk.json --> y", type("P", (), {"file": type("F", (), {
        "src_uri": "elsewhere.md"})()})(), None, None)
    assert "500 ms" in page and "generated" not in page


def test_the_ab_readers_take_every_run_of_an_arm_and_count_a_run_behind_by_its_lateness(tmp_path, monkeypatch):
    h = hooks()
    for arm, rates in (("new", (25000.0, 27500.0, None)), ("old", (17500.0, 20000.0))):
        for i, rate in enumerate(rates, 1):
            (tmp_path / f"{arm}-{i}.json").write_bytes(orjson.dumps({"find_max": {"max_sustained_rate": rate},
                                                                    "code": {"git_commit": f"{arm}1234567"}}))
    for i, late in enumerate((12.0, 1400.0, 2100.0), 1):
        (tmp_path / f"late-{i}.json").write_bytes(orjson.dumps({
            "publish_lateness_ms": {"p999": late}, "enqueue_rate": 20000.0, "sla_pass": late < 100,
            "cpu": {"postgres": {"cores": 0.9}, "firer_00": {"cores": 0.2}}}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    # a run that found no rate within the SLA counts as 0, not left out
    assert h._find_maxes("new-1.json").startswith("25,000 msg/s, the median of 3 runs (25,000, 27,500, 0)")
    assert h._find_maxes("new-1.json", against="old-1.json").endswith(": 1.33 times the 18,750 of `old1234`, run in turn")
    kept = h._kept_up("late-1.json")
    assert kept.startswith("kept up in 2 of 3 runs") and "the SLA held in 1" in kept, kept


def test_the_profile_table_names_each_process_and_its_leading_functions(tmp_path, monkeypatch):
    h = hooks()
    (tmp_path / "p.json").write_bytes(orjson.dumps({
        "command": "perf record -a", "when": "from 15 s into the load", "during": "python -m benchmarks.sla",
        "date": "2026-11-29T12:00Z", "code": "abcdef123", "samples_by_command_percent": [[20.4, "postgres"]],
        "postgres_by_process_percent": [{"share": 50.3, "process": "chronos consumer", "sessions": 1,
                                         "symbols_percent": [[19.8, "[.] _bt_compare"], [8.6, "[.] PinBuffer"]]}]}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    page = h.on_page_markdown("x <!-- generated: profile p.json --> y", type("P", (), {"file": type("F", (), {
        "src_uri": "elsewhere.md"})()})(), None, None)
    assert "| `chronos consumer` (1 session) | 50 % | `_bt_compare` 20 %, `PinBuffer` 9 % |" in page, page
    assert "PostgreSQL had 20 % of the machine's samples" in page and "code `abcdef1`" in page


def test_the_machines_load_is_read_over_the_last_minute_sampled(tmp_path, monkeypatch):
    h = hooks()
    rows = [{"from_s": s, "cores": 0.5, "by_kind": {"broker": 0.25}} for s in range(-20, 0, 10)]
    rows += [{"from_s": s, "cores": 1.5, "by_kind": {"broker": 1.0, "chronos firer": 0.3}} for s in range(0, 60, 10)]
    (tmp_path / "m.json").write_bytes(orjson.dumps({"cpu_by_10s": rows, "messages": {"lost": 7, "sent": 1000},
                                                    "load_linger_ms": 5, "reader_fetch_wait_ms": 10}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    assert h._machine("m.json") == ("the load's batches of 5 ms, the reader's fetches of 10 ms: 0-60 s after the move "
                                    "began, the machine used 1.50 cores, the broker 1.00, the firers 0.30; 7 of 1,000 "
                                    "messages not read within 120 s")


def test_a_move_says_how_many_messages_were_delivered_twice(tmp_path, monkeypatch):
    h = hooks()
    figures = {"jitter": {"p99_9_s": 0.2}, "publish_lateness": {"p99_9_s": 0.01}}
    run = {"far": 1000, "move": {"took_s": 12.0, "cut_over_s": 0.3}, "moved_partition_during_move": {"max_s": 0.4},
           "others_during_move": figures, "others_before_move": figures,
           "messages": {"sent": 5000, "lost": 0, "early": 0, "duplicated": 32}}
    (tmp_path / "twice.json").write_bytes(orjson.dumps(run))
    (tmp_path / "once.json").write_bytes(orjson.dumps({**run, "messages": {**run["messages"], "duplicated": 0}}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    assert h._move("twice.json").endswith("0 lost, 0 early, 32 delivered twice of 5,000")
    assert h._move("once.json").endswith("0 lost, 0 early of 5,000")


def test_a_control_run_is_told_apart_from_a_move_over_the_same_seconds(tmp_path, monkeypatch):
    h = hooks()
    figures = {"jitter": {"p99_9_s": 0.15}, "publish_lateness": {"p99_9_s": -0.02}}
    (tmp_path / "control.json").write_bytes(orjson.dumps({
        "far": 1000, "move": None, "control_s": 56.0, "moved_partition_during_move": {"max_s": 0.4},
        "others_during_move": figures, "others_before_move": figures,
        "messages": {"sent": 5000, "lost": 0, "early": 0, "duplicated": 0}}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    assert h._move("control.json") == (
        "no move (a control), 1,000 far-future rows left in place; the other partitions' p99.9 150 ms over the 56 s "
        "where a move would begin, 150 ms before it (their publishes' -20.0 ms and -20.0 ms); 0 lost, 0 early of 5,000")


def test_the_harness_s_own_collections_are_counted_over_the_move(tmp_path, monkeypatch):
    h = hooks()
    figures = {"jitter": {"p99_9_s": 0.15}, "publish_lateness": {"p99_9_s": -0.02}}
    run = {"far": 1000, "move": {"took_s": 50.0, "cut_over_s": 0.3}, "moved_partition_during_move": {"max_s": 0.4},
           "others_during_move": figures, "others_before_move": figures, "collect_garbage": True,
           "messages": {"sent": 5000, "lost": 0, "early": 0, "duplicated": 0},
           "harness_gc_pauses": [{"at_s": -3.0, "generation": 2, "ms": 400.0}, {"at_s": 10.0, "generation": 2, "ms": 98.8},
                                 {"at_s": 45.2, "generation": 2, "ms": 241.6}, {"at_s": 60.0, "generation": 2, "ms": 500.0}]}
    (tmp_path / "on.json").write_bytes(orjson.dumps(run))
    (tmp_path / "off.json").write_bytes(orjson.dumps({**run, "collect_garbage": False, "harness_gc_pauses": []}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    assert h._gc_pauses("on.json").startswith("the harness collecting its garbage: 2 collections of 5 ms or more in "
                                              "the move's 50 s, the longest 242 ms; 1,000 far-future rows moved")
    assert h._gc_pauses("off.json") == "the harness with its collector off: no collection of 5 ms or more in the move's 50 s"


def test_a_move_on_aged_tables_says_how_many_messages_went_through_them_and_their_size(tmp_path, monkeypatch):
    h = hooks()
    figures = {"jitter": {"p99_9_s": 0.15}, "publish_lateness": {"p99_9_s": -0.02}}
    (tmp_path / "aged.json").write_bytes(orjson.dumps({
        "far": 1000, "move": None, "control_s": 56.0, "aged": 3_000_000, "table_mb": {"cell1": 1234.5, "cell2": 980.0},
        "moved_partition_during_move": {"max_s": 0.4}, "others_during_move": figures, "others_before_move": figures,
        "messages": {"sent": 5000, "lost": 0, "early": 0, "duplicated": 0}}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    assert h._move("aged.json").startswith("each cell's table through 3,000,000 messages first (1,234 MB and 980 MB "
                                           "then); no move (a control)")


def test_a_moves_start_counts_the_requests_for_the_lock_that_waited_not_those_of_its_end(tmp_path, monkeypatch):
    h = hooks()
    figures = {"jitter": {"p99_9_s": 0.15}, "publish_lateness": {"p99_9_s": -0.02}}
    busy = "2026-11-29T18:12:55.284Z INFO    operator[a0688d98] the watch: the table is busy, trying again"
    said = [[0.1, busy]] * 27 + [[50.0, busy.replace("] the watch", "] dropping the watch")]] * 25
    (tmp_path / "m.json").write_bytes(orjson.dumps({
        "far": 1000, "move": {"took_s": 50.0, "cut_over_s": 0.3}, "moved_partition_during_move": {"max_s": 0.4},
        "others_during_move": figures, "others_before_move": figures, "move_said": said,
        "others_by_10s": [{"from_s": -10, "publish_p99_9_s": -0.02, "publish_max_s": 0.0},
                          {"from_s": 0, "publish_p99_9_s": 0.025, "publish_max_s": 0.076}],
        "messages": {"sent": 5000, "lost": 0, "early": 0, "duplicated": 0}}))
    monkeypatch.setattr(h, "RESULTS", tmp_path)
    # 25 tries only if free at once, then two that waited and failed, and the one that had it
    assert h._move_start("m.json").startswith("in its first 10 s the other partitions' publishes 25.0 ms at p99.9, "
                                              "76.0 ms at most, and 3 requests of the move for the table's lock "
                                              "that waited; 1,000 far-future rows moved in 50 s")
