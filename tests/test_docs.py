"""The documentation names only what exists and shows only commands that compose.

README.md, docs/*.md and tests/README.md are read as text: every repository path they name (``configs/...``,
``addernet/...``, ``scripts/...``, ``tests/...``, ``docs/...``, a ``tests/x.py::name`` test, a relative link and its
``#anchor``) must exist, and every command of an entry point (``train.py``, ``test.py``, ``scripts/quantize.py``,
``scripts/export_onnx.py``, ``scripts/dist_train.sh``, ``scripts/reproduce.sh``), in a fenced shell block or an
inline code span, must compose with its overrides through Hydra's compose API (nothing runs and nothing on disk is
read, so a ``<folder>`` placeholder or a ``../shared`` path is fine). docs/README.md lists every page; the README
stays short.
"""

import importlib.util
import itertools
import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException

from addernet.config.validate import one_line

from helpers import REPO, compose

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "tests" / "README.md"]

# the command-line entry points and the config each composes
ENTRIES = {
    "train.py": "train",
    "addernet.train": "train",
    "addernet-train": "train",
    "test.py": "test",
    "addernet.test": "test",
    "addernet-test": "test",
    "scripts/quantize.py": "quantize",
    "addernet.tools.quantize": "quantize",
    "scripts/export_onnx.py": "export_onnx",
    "addernet.tools.export_onnx": "export_onnx",
    "scripts/dist_train.sh": "train",
    "scripts/reproduce.sh": "train",
    "addernet.tools.reproduce": "test",  # scripts/reproduce.sh cifar10: the tool's flags, then test.py's overrides
}
# entry points whose first argument is not an override: the override it stands for (None: nothing to compose)
FIRST_ARGUMENT = {
    "scripts/dist_train.sh": lambda nproc: None,
    "scripts/reproduce.sh": lambda preset: None if preset in ("--list", "cifar10") else f"experiment={preset}",
    "addernet.tools.reproduce": lambda dataset: None,
}
# the reproduction tool's own flags (addernet/tools/reproduce.py): those that take a value, and those that do not
REPRODUCE_FLAGS = {"--checkpoint": 1, "--data-root": 1, "--bits": 1, "--out": 1, "--no-onnx": 0}
# Hydra's own flags that take a value, and those that do not (besides -m / --multirun)
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp", "--config-name"}
HYDRA_FLAGS = {"--help", "-h", "--hydra-help", "--resolve", "--version", "--run", "-r"}
# a Hydra plug-in an optional extra installs: the config option it provides, the module that provides it
PLUGINS = {
    "hydra/sweeper/optuna": "hydra_plugins.hydra_optuna_sweeper",
    "hydra/launcher/submitit_local": "hydra_plugins.hydra_submitit_launcher",
    "hydra/launcher/submitit_slurm": "hydra_plugins.hydra_submitit_launcher",
}
# files the docs ask the reader to write (docs/extending.md, docs/tasks.md): named, not in the repository
EXAMPLE_FILES = {
    "addernet/models/mynet.py",
    "configs/model/mynet.yaml",
    "configs/data/flowers.yaml",
    "addernet/tasks/l2_penalty.py",
    "configs/task/l2_penalty.yaml",
}
EXAMPLE_CHOICES = {f"{Path(f).parent.name}={Path(f).stem}" for f in EXAMPLE_FILES if f.startswith("configs/")}
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
PLACEHOLDER = "placeholder"

# a repository path: one of the top-level folders at the start of a word, then path characters (a glob allowed)
PATH = re.compile(r"(?<![\w./~$-])((?:configs|addernet|scripts|tests|docs)/[\w./*-]*)(::\w+)?")
COMMAND_SPAN = re.compile(r"`((?:[A-Z_0-9]+=\S+\s+)*(?:python3?|torchrun|scripts/\w+\.sh)\s[^`]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def shell_commands(text):
    """(line number, shell line) of each command of a Markdown text: the lines of its fenced shell blocks (see
    shell_lines) and each inline code span that is a command (``python ...``, ``torchrun ...`` or
    ``scripts/<name>.sh ...``, perhaps after ``VAR=value``)."""
    found, prose, block = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"\s*```\s*(\w*)", line)
        if fence and block is None:
            block = (number + 1, fence.group(1), [])
        elif fence:
            found += shell_lines(block[2], block[0]) if block[1] in SHELL_LANGUAGES else []
            block = None
        elif block is not None:
            block[2].append(line)
        prose.append("" if fence or block is not None else line)
    prose = "\n".join(prose)
    for span in COMMAND_SPAN.finditer(prose):
        found.append((prose.count("\n", 0, span.start()) + 1, span.group(1).replace("\n", " ")))
    return sorted(found)


def shell_lines(lines, first):
    """(line number, command line) of a shell block: continuations joined, comments dropped, a one-line ``for V in
    A B; do ... done`` loop unrolled into one line per value."""
    out, pending, start = [], "", first
    for number, line in enumerate(lines, first):
        if not pending:
            start = number
        line = re.sub(r"(^|\s)#.*", "", line)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        loop = re.match(r"\s*for (\w+) in ([^;]+); do (.*?)[;&]?\s*done\s*$", line)
        if loop:
            var, values, body = loop.groups()
            out += [(start, re.sub(rf"\$\{{?{var}\}}?\b", value, body)) for value in values.split()]
        elif line.strip():
            out.append((start, line))
    return out


def entry_commands(line):
    """(entry point, Hydra arguments) of each entry-point command of one shell line (``;``, ``&&``, ``|``, ``&``
    separate commands; a redirection ends one), once for each choice of its ``<a|b|c>`` placeholders; any other
    ``<...>`` is a plain word. What only shows the syntax is left out: ``...``, and a placeholder for a key or a
    whole group choice (``<key>=<value>``, ``experiment=<preset>``)."""
    holders = []
    line = re.sub(r"<([^<>\n]+)>", lambda m: holders.append(m.group(1)) or f"@{len(holders) - 1}@", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # a line inside a quoted multi-line argument (python -c "...")
        if any(re.search(rf"(^|\s){re.escape(name)}(\s|$)", line) for name in ENTRIES):
            raise
        return []
    commands, entry, args, first, skip = [], None, [], False, 0
    for i, token in enumerate(tokens + [";"]):
        if set(token) <= set("();<>|&"):
            if entry:
                commands.append((entry, args[:-1] if args and args[-1].isdigit() and token[0] in "<>" else args))
            entry, args = None, []
        elif skip:
            skip -= 1
        elif entry == "addernet.tools.reproduce" and token.strip("[]") in REPRODUCE_FLAGS:
            skip = REPRODUCE_FLAGS[token.strip("[]")]
        elif entry:
            if first and entry == "scripts/reproduce.sh" and token == "cifar10":
                entry = "addernet.tools.reproduce"
            token, first = FIRST_ARGUMENT[entry](token) if first else token, False
            key, _, value = (token or "...").strip("[]").partition("=")
            if (
                key != "..."
                and "@" not in key
                and not (re.fullmatch(r"@\d+@", value) and (REPO / "configs" / key).is_dir())
            ):
                args.append(token)
        elif token in ENTRIES and (not token.startswith("addernet.") or tokens[i - 1] == "-m"):
            entry, first = token, token in FIRST_ARGUMENT
    out = []
    for entry, args in commands:
        used = sorted({int(n) for arg in args for n in re.findall(r"@(\d+)@", arg)})
        for choice in itertools.product(*(holders[n].split("|") if "|" in holders[n] else [PLACEHOLDER] for n in used)):
            values = dict(zip(used, choice))
            out.append((entry, [re.sub(r"@(\d+)@", lambda m: values[int(m.group(1))], arg) for arg in args]))
    return out


def overrides(args):
    """The override lists a command composes: one per job of a multirun (``-m``, sweeps expanded), else one.
    Hydra's flags are dropped; ``[key=value]`` (an optional argument) is taken as given, ``key=...`` as a word."""
    multirun, kept, skip = False, [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-m", "--multirun"):
            multirun = True
        elif arg in HYDRA_FLAGS_WITH_VALUE:
            skip = True
        elif arg in HYDRA_FLAGS:
            continue
        elif arg.startswith("-"):
            raise ValueError(f"{arg}: not a flag of a Hydra application")
        else:
            arg = arg[1:-1] if arg.startswith("[") and arg.endswith("]") else arg
            kept.append(re.sub(r"=\.\.\.$", f"={PLACEHOLDER}", arg))
    if not multirun:
        return [kept]
    parsed = OverridesParser.create().parse_overrides(kept)
    values = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    return [list(job) for job in itertools.product(*values)]


def doc_commands(docs=DOCS):
    """(doc:line, entry point, arguments) of every entry-point command of the docs."""
    found = []
    for doc in docs:
        for number, line in shell_commands(doc.read_text()):
            found += [(f"{doc.relative_to(REPO)}:{number}", *command) for command in entry_commands(line)]
    return found


def compose_error(entry, args):
    """Why ``<entry> args`` does not compose, in one line as the entry point says it; None where it composes.
    Skips the test where a Hydra plug-in of an optional extra that the command chooses is absent."""
    try:
        for job in overrides(args):
            compose(job, config_name=ENTRIES[entry])
    except MissingConfigException as e:
        plugin = next((p for p in PLUGINS if f"'{p}'" in str(e)), None)
        if plugin and importlib.util.find_spec(PLUGINS[plugin]) is None:
            pytest.skip(f"{plugin} needs {PLUGINS[plugin]} (an optional extra), absent here")
        return one_line(e)
    except Exception as e:
        return one_line(e)
    return None


def slug(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc):
    """The anchors of a Markdown file's headings (a repeated heading's copies get -1, -2, ...)."""
    seen, out, in_code = {}, set(), False
    for line in doc.read_text().splitlines():
        if re.match(r"\s*```", line):
            in_code = not in_code
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not in_code:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            out.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return out


def wrong_references(doc, text=None):
    """``doc:line: what`` for each path, test or link of ``doc`` that does not exist."""
    text = doc.read_text() if text is None else text
    wrong = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{doc.relative_to(REPO)}:{number}"
        for match in PATH.finditer(line):
            path, test = match.group(1).rstrip("."), match.group(2)
            if path in EXAMPLE_FILES:
                continue
            if not any(REPO.glob(path)) if "*" in path else not (REPO / path).exists():
                wrong.append(f"{where}: {path} does not exist")
            elif test and not re.search(rf"^\s*(async )?(def|class) {test[2:]}\b", (REPO / path).read_text(), re.M):
                wrong.append(f"{where}: {path} has no test {test[2:]}")
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                wrong.append(f"{where}: link {target} does not exist")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                wrong.append(f"{where}: link {target}: no heading #{anchor} in {path.relative_to(REPO)}")
    return wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_named_paths_tests_and_links_exist(doc):
    wrong = wrong_references(doc)
    assert not wrong, "\n".join(wrong)


COMMANDS = doc_commands()


@pytest.mark.parametrize("where,entry,args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_documented_command_composes(where, entry, args):
    example = EXAMPLE_CHOICES.intersection(args)
    if example:
        pytest.skip(f"{', '.join(example)}: the config the docs ask the reader to write")
    error = compose_error(entry, args)
    assert error is None, f"{where}: `{entry} {' '.join(args)}` does not compose: {error}"


def test_every_entry_point_has_a_documented_command():
    assert {ENTRIES[entry] for _, entry, _ in COMMANDS} == set(ENTRIES.values())


def test_the_docs_index_lists_every_page():
    listed = set(LINK.findall((REPO / "docs" / "README.md").read_text()))
    assert listed == {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}


def test_the_readme_is_short_and_reaches_its_quick_start_first():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 120
    assert lines.index("## Quick start (offline)") < 40 - 5  # its three commands within the first 40 lines


def test_the_checker_finds_a_wrong_path_a_wrong_override_and_reads_shell_syntax():
    doc = REPO / "docs" / "planted.md"  # never written: its text is given
    text = "`configs/optim/adamw.yaml`, `configs/optim/adamz.yaml`, [x](training.md#no-such-heading)\n"
    assert wrong_references(doc, text) == [
        "docs/planted.md:1: configs/optim/adamz.yaml does not exist",
        "docs/planted.md:1: link training.md#no-such-heading: no heading #no-such-heading in docs/training.md",
    ]
    text = "\n".join(
        [
            "Train with `python train.py [experiment=<preset>] [<key>=<value> ...]`, e.g.",
            "```bash",
            "OMP_NUM_THREADS=1 python train.py -m data=fake trainer.seed=0,1 \\",
            "    trainer.epochs=<1|2> data.root=<a folder>   # two seeds",
            "for e in 1 3; do python test.py checkpoint=run$e/best.pt trainer.device=cpu > out$e.txt 2>&1 & done",
            "scripts/dist_train.sh 8 data=fake; NPROC=2 scripts/reproduce.sh mnist_lenet5_bn_adder data.root=<dir>",
            "python -m addernet.train trainer.epochz=1 && tensorboard --logdir outputs",
            "```",
        ]
    )
    commands = [(n, *c) for n, line in shell_commands(text) for c in entry_commands(line)]
    assert commands == [
        (1, "train.py", []),
        (3, "train.py", ["-m", "data=fake", "trainer.seed=0,1", "trainer.epochs=1", f"data.root={PLACEHOLDER}"]),
        (3, "train.py", ["-m", "data=fake", "trainer.seed=0,1", "trainer.epochs=2", f"data.root={PLACEHOLDER}"]),
        (5, "test.py", ["checkpoint=run1/best.pt", "trainer.device=cpu"]),
        (5, "test.py", ["checkpoint=run3/best.pt", "trainer.device=cpu"]),
        (6, "scripts/dist_train.sh", ["data=fake"]),
        (6, "scripts/reproduce.sh", ["experiment=mnist_lenet5_bn_adder", f"data.root={PLACEHOLDER}"]),
        (7, "addernet.train", ["trainer.epochz=1"]),
    ]
    assert len(overrides(commands[1][2])) == 2  # a job per seed
    assert [compose_error(entry, args) for _, entry, args in commands[:-1]] == [None] * 7
    assert "unknown key trainer.epochz (did you mean trainer.epochs?)" in compose_error(
        "train.py", ["trainer.epochz=1"]
    )
    assert "Ambiguous value" in compose_error("train.py", ["trainer.seed=0,1"])  # a sweep without -m
