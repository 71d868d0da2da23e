"""`python tools/workshop_figures.py` — the workshop's memory, class-size, Binder and Zero-to-JupyterHub figures,
computed from the committed class load measurement (`make class-load`, data/benchmarks/jupyterhub/class-load-cpu.json)
and written into docs/workshop.md and docs/jupyterhub/z2jh-values.yaml between their `generated:` markers
(`make workshop-figures`). `--check` writes nothing and exits 1 where a document differs from what the JSON gives.

The rules, each applied to the measured figures:
- a learner with one notebook open: the largest peak of a class learner's server plus kernel (resident memory),
  rounded up to 0.1 GiB; with a second notebook left open until the culler shuts it: that plus the largest kernel;
- a class on a server: (its memory less SYSTEM_GIB kept for the system and the hub) ÷ a learner's, rounded down;
  everyone's first cell at once: the "two open" class × the slowest first cell of the lone run (one core's work)
  ÷ the cores;
- each notebook's memory: the lone learner's peak of the kernel and every process it starts while that notebook
  runs, plus the server's; it fits Binder when that is within BINDER_LIMIT_GIB.
"""

import argparse
import json
import math
import os
import re
import sys
import textwrap
from pathlib import Path

from qwenvl_lab.course.notebooks import NOTEBOOKS

MEASURED = Path("data") / "benchmarks" / "jupyterhub" / "class-load-cpu.json"
WORKSHOP = Path("docs") / "workshop.md"
Z2JH_VALUES = Path("docs") / "jupyterhub" / "z2jh-values.yaml"
SYSTEM_GIB = 2.0  # kept for the system, the hub and its proxy on a class server
SERVERS = ((8, 32), (16, 64), (32, 128))  # (cores, GiB): class servers after the measured machine, on paper
CLASS = 30  # a class of this size in the prose
WIDTH = 118  # the documents' line length
# mybinder.org: singleuser memory limit 2G (jupyterhub/mybinder.org-deploy, mybinder/values.yaml at
# 95860dbcba2031b930020dbd856e76cd37ba34c8), which JupyterHub reads as 2 GiB (its ByteSpecification: G = 1024³)
BINDER_LIMIT_GIB = 2.0
BINDER_SOURCE = "jupyterhub/mybinder.org-deploy, mybinder/values.yaml at 95860dbc"
MARKER = re.compile(
    r"^(?P<indent>[ ]*)(?:<!-- |# )generated: (?P<name>[\w-]+)\b.*?$\n(?P<body>.*?)^[ ]*(?:<!-- |# )end generated: "
    r"(?P=name)(?: -->)?$",
    re.MULTILINE | re.DOTALL,
)


class FiguresError(ValueError):
    """The measurement lacks what a figure needs, or a document lacks a marker; the message says which."""


def up(value: float, step: float = 0.1) -> float:
    """`value` rounded up to a multiple of `step` (0.1 GiB)."""
    return round(math.ceil(round(value / step, 6)) * step, 1)


def need(result: dict, *keys):
    """result[keys[0]][keys[1]]…, or a FiguresError naming the missing key."""
    value = result
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise FiguresError(
                f"{MEASURED} has no {'.'.join(keys)}: measure again with this version's `make class-load`"
            )
        value = value[key]
    return value


def derived(result: dict) -> dict:
    """Every figure the documents quote, from a class load measurement (its JSON as a dict)."""
    learners = need(result, "learners")
    if not learners:
        raise FiguresError(f"{MEASURED} holds no class learners")
    peaks = [need(r, "peak_memory_gib") for r in learners]
    one_open = max(p["kernel_rss"] + p["server_rss"] for p in peaks)
    kernel = max(p["kernel_rss"] for p in peaks)
    lone = need(result, "lone")
    by_notebook = need(lone, "peak_memory_by_notebook_gib")
    server = need(lone, "peak_memory_gib", "server_rss")
    notebooks = {nb: by_notebook[nb]["kernel_rss"] for nb in sorted(by_notebook)}
    with_server = {nb: round(value + server, 2) for nb, value in notebooks.items()}
    core = need(result, "settings", "notebooks")
    first_cell = max(need(lone, "first_cell_s", nb) for nb in core)  # a notebook's imports: one core's work
    per_learner, two_open = up(one_open), up(one_open + kernel)
    machine = need(result, "machine")
    servers = [(machine["cores"], round(machine["memory_gib"]))] + list(SERVERS)
    rows = []
    for cores, memory in servers:
        one = math.floor((memory - SYSTEM_GIB) / per_learner)
        two = math.floor((memory - SYSTEM_GIB) / two_open)
        rows.append({"cores": cores, "memory_gib": memory, "one_open": one, "two_open": two,
                     "first_cells_s": round(two * first_cell / cores)})  # fmt: skip
    cpu = [s for r in learners for s in [sum(need(r, "kernel_cpu_s").values())]]
    worst = max(with_server, key=with_server.get)
    worst_core = max((nb for nb in with_server if nb in core), key=with_server.get)
    return {
        "one_open_gib": round(one_open, 2),
        "kernel_gib": round(kernel, 2),
        "per_learner_gib": per_learner,
        "two_open_gib": two_open,
        "server_gib": round(server, 2),
        "notebooks_gib": notebooks,
        "with_server_gib": with_server,
        "worst": worst,
        "worst_core": worst_core,
        "all_open_gib": round(sum(notebooks.values()) + server, 1),
        "binder_misfits": [nb for nb, value in with_server.items() if value > BINDER_LIMIT_GIB],
        "unmeasured": [n.number for n in NOTEBOOKS if n.number not in notebooks],
        "first_cell_s": round(first_cell, 1),
        "rows": rows,
        "cpu_s": (round(min(cpu)), round(max(cpu))),
    }


def wrapped(*paragraphs: str) -> str:
    """Markdown paragraphs and bullets, each wrapped at WIDTH (a bullet's lines indented under its text); tables and
    blank lines as they are."""
    out = []
    for text in paragraphs:
        if text.startswith("|") or not text:
            out.append(text)
        else:
            indent = "  " if text.startswith("- ") else ""
            out.append(textwrap.fill(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False))
    return "\n".join(out)


def learner_rows(result: dict) -> list[str]:
    """The per-learner table of the measured class: the lone learner, then each class learner."""
    lines = [
        "| learner | server start | cell latency, median | 95th percentile | slowest | server peak, GiB "
        "| kernel peak, GiB (PSS) | kernel CPU | first pull | second pull | errors | outputs ≠ alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    class_notebooks = result["settings"]["notebooks"]
    for label, report in [("alone", result["lone"])] + [(str(i + 1), r) for i, r in enumerate(result["learners"])]:
        lat, peak = report["latency"], report["peak_memory_gib"]
        if label == "alone":  # the lone learner ran every notebook: the class's notebooks' cells are compared
            lat = report["latency_of_class_notebooks"]
        cpu = sum(v for nb, v in report["kernel_cpu_s"].items() if nb in class_notebooks)
        pulls = [f"{p['seconds']:.1f} s" for p in report["pulls"]] + ["–", "–"]
        lines.append(
            f"| {label} | {report['server_start_s']:.1f} s | {lat['median_s']:.3f} s | {lat['p95_s']:.2f} s "
            f"| {lat['max_s']:.1f} s "
            f"| {peak['server_rss']:.2f} | {peak['kernel_rss']:.2f} ({peak['kernel_pss']:.2f}) | {cpu:.0f} s "
            f"| {pulls[0]} | {pulls[1]} | {len(report['errors'])} | {len(report['output_differences'])} |"
        )
    return lines


def regions(result: dict) -> dict[str, str]:
    """The generated parts of docs/workshop.md, by marker name."""
    f = derived(result)
    nbs = list(f["notebooks_gib"])
    settings, klass, machine = result["settings"], result["class"], result["machine"]
    n = settings["learners"]
    memory_table = "\n".join(
        [
            "| notebook | " + " | ".join(nbs) + " |",
            "|---|" + "---|" * len(nbs),
            "| peak memory, GiB | " + " | ".join(f"{f['notebooks_gib'][nb]:.2f}" for nb in nbs) + " |",
        ]
    )
    misfits = f["binder_misfits"]
    binder = (
        f"every notebook fits, the largest ({f['worst']}) at {f['with_server_gib'][f['worst']]:.2f} GiB"
        if not misfits
        else "notebook"
        + ("s " if len(misfits) > 1 else " ")
        + ", ".join(f"{nb} ({f['with_server_gib'][nb]:.2f} GiB)" for nb in misfits)
        + (" do" if len(misfits) > 1 else " does")
        + " not fit: run "
        + ("them" if len(misfits) > 1 else "it")
        + " on a laptop or the class server; every other notebook measured fits"
    )
    if f["unmeasured"]:
        binder += f" (not measured in this run: {', '.join(f['unmeasured'])})"
    size_rows = "\n".join(
        f"| {r['cores']} cores, {r['memory_gib']} GiB | {r['one_open']} | {r['two_open']} | {r['first_cells_s']} s |"
        for r in f["rows"]
    )
    out = {}
    out["kernels"] = wrapped(
        f"- **Leaving kernels running**: each open notebook holds a kernel of {min(f['notebooks_gib'].values()):.1f}–"
        f'{max(f["notebooks_gib"].values()):.1f} GiB (measured: the table in "One server for a class"). Closing a '
        "tab does not stop it; Kernel → Shut Down Kernel (or the Running panel on the left) does."
    )
    out["notebook-memory"] = wrapped(
        *[
            "Memory per learner, measured by the class load test's lone learner (below) as each notebook's peak "
            "resident memory, summed over its kernel and every process the kernel starts (notebook 07 starts fresh "
            "Python processes to measure each dtype's memory), sampled every "
            f"{settings['memory_samples_s']['lone']:g} s:",
            "",
            memory_table,
            "",
            "A kernel keeps about its peak while it stays open (Python rarely gives memory back). The JupyterLab "
            f"server itself takes about {f['server_gib']:.2f} GiB per learner.",
            "",
            f"With one notebook open at a time, a learner needs at most about {f['with_server_gib'][f['worst']]:.1f} "
            f"GiB (notebook {f['worst']} and its processes, plus the server), "
            f"{f['with_server_gib'][f['worst_core']]:.1f} GiB on the core path ({f['worst_core']}). A class of "
            f"{CLASS} with one notebook open each needs about {CLASS * f['with_server_gib'][f['worst']]:.0f} GiB at "
            f"the worst moment (everyone in {f['worst']} together), about "
            f"{CLASS * f['with_server_gib'][f['worst_core']]:.0f} GiB on the core path; with all {len(nbs)} open, one "
            f"learner alone takes about {f['all_open_gib']:.1f} GiB.",
            "",
            f"**Binder** (mybinder.org gives a session at most {BINDER_LIMIT_GIB:g} GiB: {BINDER_SOURCE}): with the "
            f"server's {f['server_gib']:.2f} GiB, {binder}.",
        ]
    )
    lone_cells = settings.get("lone_code_cells", settings["code_cells"])
    out["measured"] = wrapped(
        *[
            f"**Measured** with `make class-load CLASS_LEARNERS={n}` (as root; `python tools/classload.py`): the hub "
            "runs the configuration above, with a password authenticator and one system user per simulated learner "
            "(made for the run, removed after it), on 127.0.0.1 only. Each learner logs in through the hub's login "
            "form, starts their server and opens nbgitpuller's link, which clones the course into their home (the "
            "upstream: a bare git repository on the same machine holding the clone's files); each edits a cell of "
            "notebook 00 there. One learner alone runs every notebook "
            f"({', '.join(settings['lone_notebooks'])}: {lone_cells} code cells), then {n} at once "
            f"({settings['stagger_s']:g} s apart) run notebooks {', '.join(settings['notebooks'])} "
            f"({settings['code_cells']} code cells) cell by cell through the Jupyter server's REST API and kernel "
            f"websocket, with {settings['think_s']:g} s of think time (±50%) between cells and one notebook open at a "
            "time. Once every learner has pulled, the upstream gets a new cell in notebook 00; after the notebooks "
            "each learner pulls again through the link. The machine: "
            f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, shared with other work; load "
            f"average {machine['load_average'][0]} at the start and {result['load_average_end'][0]} at the end; "
            f"{result['date'][:10]}. JupyterHub {result['versions']['jupyterhub']}, JupyterLab "
            f"{result['versions']['jupyterlab']}, torch {result['versions']['torch']}. Results: `{MEASURED.as_posix()}`.",
            "",
            *learner_rows(result),
            "",
            f"- **{klass['errors']} errors; {klass['output_differences']} text outputs differ from the lone run's** "
            "(cells marked `NBVAL_IGNORE_OUTPUT` aside); the shared install "
            + ("did not change" if result["shared_install_unchanged"] else "**changed**")
            + " (every file's size and time compared before and after).",
            f"- **nbgitpuller**: on the second pull {klass['second_pulls_kept_edit_and_got_update']} of {n} learners "
            "kept their edited cell and got the upstream's new one "
            + ("(and so did the lone learner)." if all(result["lone"]["second_pull"].values()) else "."),
            f"- **Memory per learner: {f['one_open_gib']:.2f} GiB** at its peak with one notebook open (server and "
            f"kernel, resident); {klass['peak_memory_per_learner_gib']:.2f} GiB counting shared pages proportionally "
            f"(PSS). The machine as a whole used {klass['machine_memory_used_at_peak_gib']:.2f} GiB more at the "
            "class's peak than before it (other work on the machine included).",
            f"- **CPU per learner:** {f['cpu_s'][0]}–{f['cpu_s'][1]} CPU-seconds of kernel time for the class's "
            f"notebooks; with {n} learners on {machine['cores']} cores the median cell took "
            f"{klass['latency_vs_lone']['median']}× as long as alone and the 95th percentile "
            f"{klass['latency_vs_lone']['p95']}× ({klass['latency']['p95_s']:.1f} s), the slowest "
            f"{klass['latency']['max_s']:.0f} s.",
        ]
    )
    out["class-size"] = wrapped(
        *[
            f"**Class size**, from these figures: memory {f['per_learner_gib']:.1f} GiB a learner with one notebook "
            f"open, {f['two_open_gib']:.1f} GiB with a second left open until the culler shuts it ({SYSTEM_GIB:g} GiB "
            'kept for the system and the hub); the last column is the wait when the "two open" class runs a '
            f"notebook's first cell at the same moment ({f['first_cell_s']:.1f} s of one core each, the lone run's "
            "slowest first cell of the class's notebooks (their imports), shared by the cores). The first row is the measured machine; "
            "every row is arithmetic, not a measurement of that many learners.",
            "",
            "| server | learners, one notebook open | learners, two open | everyone's first cell at once |",
            "|---|---|---|---|",
            size_rows,
        ]
    )
    out["z2jh"] = wrapped(
        "[jupyterhub/z2jh-values.yaml](jupyterhub/z2jh-values.yaml) gives the values for the Zero-to-JupyterHub Helm "
        "chart: the image that repo2docker builds from this repository (the same `environment.yml`, `postBuild` and "
        "`start` as Binder, so each learner's server copies the notebooks and opens their copy), each learner's "
        "volume at `/home/jovyan/work` with `QWENVL_LAB_WORKDIR` pointing into it, a memory guarantee of "
        f"{f['per_learner_gib']:.1f}G and a limit of {f['two_open_gib']:.1f}G (the measured peak with one notebook "
        "open, and that with a second kernel added; the chart reads G as GiB), a CPU guarantee of 0.1 and a limit of "
        f"2 (a learner's path costs about {f['cpu_s'][1]} CPU-seconds; a burst may take two cores), and the same "
        "culling. This is on paper: no Kubernetes cluster, Helm or repo2docker build was run here."
    )
    return out


def z2jh_block(result: dict) -> str:
    """The generated memory and CPU lines of the Zero-to-JupyterHub values (indented as under `singleuser:`)."""
    f = derived(result)
    return "\n".join(
        [
            "  memory:",
            f"    guarantee: {f['per_learner_gib']:.1f}G  # measured: a learner's peak with one notebook open "
            f"({f['one_open_gib']:.2f} GiB)",
            f"    limit: {f['two_open_gib']:.1f}G  # with a second notebook's kernel left open until the culler shuts it",
            "  cpu:",
            f"    guarantee: 0.1  # measured: {f['cpu_s'][0]}-{f['cpu_s'][1]} CPU-seconds of kernel time a learner",
            "    limit: 2  # a notebook's first cell (its imports) takes seconds of one core; torch may use two",
        ]
    )


def fill(text: str, parts: dict[str, str], where: str) -> str:
    """`text` with the body between each `generated: NAME` marker and its end replaced by parts[NAME]; every part
    must have its markers, and every marker a part."""
    found = {m.group("name") for m in MARKER.finditer(text)}
    if found != set(parts):
        missing, unknown = sorted(set(parts) - found), sorted(found - set(parts))
        raise FiguresError(f"{where}: markers missing for {missing}, unknown markers {unknown}")
    return MARKER.sub(lambda m: m.group(0).replace(m.group("body"), parts[m.group("name")] + "\n", 1), text)


def documents(root: Path, result: dict) -> dict[Path, str]:
    """Each document with its generated parts as the measurement gives them."""
    workshop, values = root / WORKSHOP, root / Z2JH_VALUES
    return {
        workshop: fill(workshop.read_text(encoding="utf-8"), regions(result), str(WORKSHOP)),
        values: fill(values.read_text(encoding="utf-8"), {"resources": z2jh_block(result)}, str(Z2JH_VALUES)),
    }


def write_text(path: Path, text: str) -> None:
    """Replace `path`'s text by a rename of a finished file beside it."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def main(argv=None) -> int:
    """Command line: write the figures (or with --check, say which document differs); exit status 1 if one does."""
    parser = argparse.ArgumentParser(prog="python tools/workshop_figures.py", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a document differs")
    parser.add_argument("--measured", type=Path, help=f"the class load JSON (default: {MEASURED} in the clone)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    path = args.measured or root / MEASURED
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        wanted = documents(root, result)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    stale = [p for p, text in wanted.items() if p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(root)}: its figures differ from {path.name}'s; run make workshop-figures")
        return 1 if stale else 0
    for p in stale:
        write_text(p, wanted[p])
        print(f"wrote {p.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
