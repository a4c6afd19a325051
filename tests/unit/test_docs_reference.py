"""The reference pages are generated from the code (docs/hooks.py), and every setting, flag, metric,
reason code and exit code has a description there to generate from."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from chronos import cli, config, errors
from chronos.domain import reasons

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_has_its_row_with_a_meaning(hooks):
    page = hooks.settings_page()
    for opt in config.OPTIONS:
        assert opt.help.strip(), f"{opt.env} has no help text"
        row = next(line for line in page.splitlines() if f"`{opt.env}`" in line)
        assert f"`{opt.flag}`" in row and hooks._cell(opt.help) in row


def test_a_new_setting_gets_its_row(hooks):
    fake = config.Option("fake_setting", "a setting added after the page was written", config._str, "x")
    page = hooks.settings_page([*config.OPTIONS, fake])
    assert "`CHRONOS_FAKE_SETTING` | `--fake-setting` | `x` | a setting added after the page was written |" in page


def test_every_flag_of_every_command_is_described(hooks):
    parser = cli.build_parser()
    page = hooks.commands_page(parser)
    envs = {opt.env for opt in config.OPTIONS}
    commands = hooks.commands(parser)
    assert {"chronos send", "chronos up", "chronos pipeline schedule", "chronos reschedule"} <= {c for c, _, _ in commands}
    for name, _, sub in commands:
        assert f"## `{name}`" in page
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        for action in hooks.arguments(sub):
            assert action.help, f"{name} {action.option_strings or action.dest} has no help text"
            shown = action.option_strings[0] if action.option_strings else action.metavar or action.dest
            assert f"`{shown}`" in section, f"{name} {shown} is missing from the commands page"
            if action.metavar in envs:  # a setting: links to its row
                assert f"settings.md#{hooks._anchor(action.metavar)}" in section
    assert "`--version`" in page


def test_a_new_flag_gets_its_entry(hooks):
    parser = cli.build_parser()
    send = next(sub for name, _, sub in hooks.commands(parser) if name == "chronos send")
    send.add_argument("--fake-flag", default="y", help="a flag added after the page was written")
    section = hooks.commands_page(parser).split("## `chronos send`", 1)[1].split("\n## ", 1)[0]
    assert "| `--fake-flag` | `y` | a flag added after the page was written |" in section


def test_every_metric_is_described(hooks):
    families = hooks.metric_families()
    page = hooks.metrics_page()
    assert {"chronos_messages_fired_total", "chronos_fire_lateness_seconds", "chronos_rows_due",
            "chronos_throttled_rows", "chronos_operator_actions_total", "chronos_info"} <= set(families)
    for name, family in families.items():
        assert family["help"].strip(), f"{name} has no help text"
        assert f"| `{name}` | {family['type']} |" in page
    assert families["chronos_messages_dead_lettered_total"]["labels"] == ["reason"]
    assert families["chronos_throttled_rows"]["labels"] == ["topic"]
    assert families["chronos_messages_fired_total"]["roles"] == ["consumer", "firer"]


def test_the_metrics_guide_names_only_metrics_that_exist(hooks):
    """The hand-written overview in docs/observability/ names metrics the code exports, not old ones."""
    families = set(hooks.metric_families())
    text = "\n".join(p.read_text() for p in (ROOT / "docs" / "observability").glob("*.md"))
    named = {re.sub(r"_(bucket|count|sum)$", "", n) for n in re.findall(r"\bchronos_[a-z_]+[a-z]", text)}
    # table names in the prose, not metrics
    named -= {"chronos_parked", "chronos_actions", "chronos_messages"}
    named -= {"chronos_docs"}  # the external label of the alerts' runbook links, not a metric
    assert named - families == set()


def test_every_reason_code_is_described(hooks):
    codes = set(reasons.CONSUMER_REASONS) | set(reasons.FIRER_REASONS)
    assert set(reasons.DESCRIPTIONS) == codes
    page = hooks.reason_codes_page()
    for code in codes:
        assert reasons.DESCRIPTIONS[code].strip()
        assert f"| `{code}` |" in page
    rows = {c: who for c, who, _ in hooks.reason_codes()}
    assert rows["too_large"] == "consumer and firer" and rows["missing_id"] == "consumer"


def test_every_exit_code_is_described(hooks):
    constants = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    listed = hooks.exit_codes()
    assert {name: code for code, name, _ in listed} == constants
    assert all(doc for _, _, doc in listed)


def test_every_variable_the_docs_name_exists():
    """A `CHRONOS_*` variable named in the README or docs/ is a setting, or one of the variables the
    configuration page lists outside the settings table (so a renamed setting cannot linger in the guide)."""
    configuration = (ROOT / "docs" / "operations" / "configuration.md").read_text()
    outside = configuration.split("Variables outside the settings table:", 1)[1].split("\n## ", 1)[0]
    known = {opt.env for opt in config.OPTIONS} | set(re.findall(r"`(CHRONOS_[A-Z_]+)`", outside))
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    named = {v for page in pages for v in re.findall(r"\bCHRONOS_[A-Z_]*[A-Z]", page.read_text())}
    assert named - known == set()


def test_the_defaults_the_configuration_page_gives_are_the_codes():
    configuration = (ROOT / "docs" / "operations" / "configuration.md").read_text()
    rows = re.findall(r"^\| `(CHRONOS_[A-Z_]+)` \| (\d+) \|", configuration, re.M)
    assert len(rows) >= 6
    defaults = {opt.env: opt.default for opt in config.OPTIONS}
    assert {env: value for env, value in rows} == {env: defaults[env] for env, _ in rows}
