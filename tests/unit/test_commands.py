"""Every `chronos` sub-command is added one way: by its own module of `chronos.commands`, listed in
`chronos.commands.COMMANDS`, whose `add_parser` adds it and whose handler runs it. A command added to the
parser any other way (in chronos/cli.py, from another package, a module left out of COMMANDS) fails here."""

from __future__ import annotations

import argparse
import pkgutil
import subprocess
import sys

from chronos import cli, commands


def sub_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands of `parser`, by name, in the order they were added."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def strays(parser: argparse.ArgumentParser) -> list[str]:
    """What in `parser` breaks the rule: every runnable command (`chronos up`, `chronos pipeline report`)
    handled by `chronos.commands.<its first word>`, every module of the package that is not a helper
    (`_name`) listed in COMMANDS, and the parser's commands those of COMMANDS, in its order."""
    found = []

    def walk(path: tuple[str, ...], p: argparse.ArgumentParser) -> None:
        subs = sub_commands(p)
        if not subs:
            handler = p.get_default("func")
            module = getattr(handler, "__module__", None)
            wanted = "chronos.commands." + path[0].replace("-", "_")
            if module != wanted:
                found.append(f"chronos {' '.join(path)} is handled by {module}.{getattr(handler, '__name__', None)}, "
                             f"not by its module {wanted}")
        for name, sub in subs.items():
            walk((*path, name), sub)
    walk((), parser)
    listed = [m.__name__.rsplit(".", 1)[1] for m in commands.COMMANDS]
    modules = {m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")}
    found += [f"chronos.commands.{m} is not in COMMANDS" for m in sorted(modules - set(listed))]
    top = [name.replace("-", "_") for name in sub_commands(parser)]
    if top != listed:
        found.append(f"the parser's commands {top} are not those of COMMANDS, in their order: {listed}")
    return found


def test_every_sub_command_comes_from_its_module_in_the_commands_package():
    parser = cli.build_parser()
    assert strays(parser) == []
    assert {"consumer", "up", "pg-cluster", "pipeline", "status", "fire-now", "console"} <= set(sub_commands(parser))


def test_a_command_added_any_other_way_is_found():
    def run(args: argparse.Namespace) -> int:
        return 0

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("extra").set_defaults(func=run)   # as chronos/cli.py or another package could
    pipeline = sub_commands(parser)["pipeline"]
    jobs = next(a for a in pipeline._actions if isinstance(a, argparse._SubParsersAction))
    jobs.add_parser("reindex").set_defaults(func=run)
    sub.add_parser("no-handler")
    reindex, extra, no_handler, order = strays(parser)
    assert reindex == f"chronos pipeline reindex is handled by {__name__}.run, not by its module chronos.commands.pipeline"
    assert extra == f"chronos extra is handled by {__name__}.run, not by its module chronos.commands.extra"
    assert no_handler == "chronos no-handler is handled by None.None, not by its module chronos.commands.no_handler"
    assert order.startswith("the parser's commands [") and order.endswith("in their order: " + str(
        [m.__name__.rsplit(".", 1)[1] for m in commands.COMMANDS]))


def test_every_command_module_has_its_parser_builder_and_a_handler():
    for module in commands.COMMANDS:
        assert callable(module.add_parser), module.__name__
        assert module.__doc__ and module.__doc__.startswith("`chronos "), module.__name__


def test_a_command_module_left_out_of_commands_is_found(monkeypatch):
    monkeypatch.setattr(commands, "COMMANDS", tuple(m for m in commands.COMMANDS if m.__name__ != "chronos.commands.tail"))
    assert strays(cli.build_parser()) == ["chronos.commands.tail is not in COMMANDS"]


def test_the_alerts_name_only_commands_that_exist_and_parked_messages_say_which_to_run():
    """An alert's description and confirm lines are its runbook (docs/hooks.py makes the page from them):
    every `chronos ...` they name is a command of the parser, and ChronosMessagesParked names those that
    act on parked messages."""
    import re
    from pathlib import Path

    import yaml
    rules = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus-rules.yml"
    alerts = {r["alert"]: r["annotations"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
              if "alert" in r}
    parser = cli.build_parser()
    named = set()
    for alert, notes in alerts.items():
        for text in (notes["description"], notes["confirm"]):
            for words in re.findall(r"`chronos ([^`]+)`", text):
                p, path = parser, []
                for word in words.split():
                    subs = sub_commands(p)
                    if word not in subs:
                        break
                    p, path = subs[word], [*path, word]
                assert path and not sub_commands(p), f"{alert} names `chronos {words}`: no such command"
                named.add((alert, " ".join(path)))
    assert {("ChronosMessagesParked", c) for c in ("parked list", "parked replay", "parked drop")} <= named


def test_the_parser_loads_neither_the_postgresql_client_nor_the_stack():
    """`chronos --help`, and the parser every command runs through, load neither PostgreSQL's client nor the
    modules of `chronos up`, `chronos status` and the metrics: the handlers that need them import them (a
    command that needs none starts in half the time)."""
    code = ("import sys\n"
            "import chronos.cli\n"
            "chronos.cli.build_parser()\n"
            "heavy = ('psycopg', 'prometheus_client', 'supervisor', 'chronos.up.stack', 'chronos.up.cells',\n"
            "         'chronos.ops.status', 'chronos.ops.servers')\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy)\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True)
