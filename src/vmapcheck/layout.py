"""Every folder and file the stages exchange, named once.

``Layout(root)`` is the project on disk: stages, the CLI and tests take one and ask it
for a path; no other code builds such a path by hand. ``dvc.yaml`` declares the same
files as each stage's deps and outs (a test checks the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The files in a folder of a Layout, named here once: the modules that write and read
# them (vmapcheck.params_io, vmapcheck.data.regression) import these names.
# The params folder (Layout.params): the params, their manifest, the model's input and
# output contract (train writes it; the registry and the served model check it).
PARAMS_FILE = "params.safetensors"
MANIFEST_FILE = "manifest.json"
CONTRACT_FILE = "contract.json"
# The regression set's folder (Layout.cases): each case's file and sha256.
CASES_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Layout:
    """The files of a project rooted at ``root`` (the folder holding dvc.yaml)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # --- config and its provenance --------------------------------------------------
    @property
    def params_yaml(self) -> Path:
        """The composed config every stage reads (dvc exp run -S rewrites it)."""
        return self.root / "params.yaml"

    @property
    def conf(self) -> Path:
        """The Hydra config groups params.yaml is composed from."""
        return self.root / "conf"

    @property
    def config_yaml(self) -> Path:
        """The primary Hydra config: the defaults list and the shipped groups' search path."""
        return self.conf / "config.yaml"

    def conf_option(self, group: str, option: str) -> Path:
        """``conf/<group>/<option>.yaml``: a config option of the project's own."""
        return self.conf / group / f"{option}.yaml"

    @property
    def project_params(self) -> Path:
        """The project's own params, composed into params.yaml (``vmapcheck init`` moves
        them here from the params.yaml of a project it joins; the project's file)."""
        return self.conf / "project.yaml"

    @property
    def running_record(self) -> Path:
        """The ``dvc`` process running this workspace's pipeline now
        (:mod:`vmapcheck.running`), in DVC's own temporary folder."""
        return self.root / ".dvc" / "tmp" / "vmapcheck-run.json"

    @property
    def init_manifest(self) -> Path:
        """What ``vmapcheck init`` wrote last: each file's and stage's sha256
        (:mod:`vmapcheck.project.merge`)."""
        return self.root / ".vmapcheck" / "init.json"

    @property
    def plots_template(self) -> Path:
        """The log-log Vega-Lite template of the latency plot (dvc.yaml: ``template:
        loglog``): a colour per batch path."""
        return self.root / ".dvc" / "plots" / "loglog.json"

    @property
    def speedup_template(self) -> Path:
        """The same template for the speed-up plot (dvc.yaml: ``template: speedup``): a
        colour per speed-up, each with its interval."""
        return self.root / ".dvc" / "plots" / "speedup.json"

    @property
    def plots_page(self) -> Path:
        """The HTML template `dvc plots show` fills (.dvc/config: plots.html_template), with
        Vega inlined so that the page draws offline (vmapcheck.project.plots_page)."""
        return self.root / ".dvc" / "plots" / "offline.html"

    @property
    def next_steps(self) -> Path:
        """What `vmapcheck init` says to do next (VMAPCHECK.md)."""
        return self.root / "VMAPCHECK.md"

    @property
    def dvc_yaml(self) -> Path:
        """The pipeline: each stage's cmd, deps, params and outs."""
        return self.root / "dvc.yaml"

    @property
    def dvc_lock(self) -> Path:
        return self.root / "dvc.lock"

    @property
    def requirements_lock(self) -> Path:
        return self.root / "requirements.lock"

    @property
    def code_records(self) -> Path:
        """The ``code`` stage's records: which vmapcheck code each stage runs."""
        return self.reports / "code"

    def code_record(self, stage: str) -> Path:
        """``reports/code/<stage>.json`` (:mod:`vmapcheck.project.code`), a dep of ``stage``."""
        return self.code_records / f"{stage}.json"

    # --- data -------------------------------------------------------------------------
    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def raw(self) -> Path:
        """The user's source tables (never logged, never committed by an experiment)."""
        return self.data / "raw"

    @property
    def raw_readme(self) -> Path:
        return self.raw / "README.md"

    @property
    def prepared(self) -> Path:
        """prepare's anonymized splits: ``<split>.npz`` (features, targets)."""
        return self.data / "prepared"

    @property
    def prepared_manifest(self) -> Path:
        """What prepare did: the anonymization, the feature names, the rows per split."""
        return self.prepared / "manifest.json"

    @property
    def cases(self) -> Path:
        """The regression set: one ``<case>.npz`` each and :attr:`cases_manifest`."""
        return self.data / "cases"

    @property
    def cases_manifest(self) -> Path:
        return self.cases / CASES_MANIFEST

    @property
    def params(self) -> Path:
        """train's verified params: params.safetensors, manifest.json, contract.json."""
        return self.data / "params"

    @property
    def params_manifest(self) -> Path:
        return self.params / MANIFEST_FILE

    @property
    def contract(self) -> Path:
        return self.params / CONTRACT_FILE

    @property
    def forward(self) -> Path:
        """forward's outputs (:attr:`outputs`) and what each path did (:attr:`record`)."""
        return self.data / "forward"

    @property
    def outputs(self) -> Path:
        return self.forward / "outputs.npz"

    @property
    def record(self) -> Path:
        return self.forward / "record.json"

    @property
    def reference_outputs(self) -> Path:
        """The paths' outputs on the stored reference's inputs (compared by check)."""
        return self.forward / "reference_outputs.npz"

    @property
    def composition(self) -> Path:
        """The batch paths' outputs on batches regrouped (rows permuted; split in halves),
        back in the original row order (vmapcheck.core.composition; judged by check)."""
        return self.forward / "composition.npz"

    @property
    def gradients(self) -> Path:
        """Per-example and batch gradients on the standard case (judged by check)."""
        return self.forward / "gradients.npz"

    # --- reports ----------------------------------------------------------------------
    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def report(self, name: str) -> Path:
        """``reports/<name>`` (e.g. ``check.json``, ``diagnosis-on-demand.txt``)."""
        return self.reports / name

    @property
    def train_report(self) -> Path:
        return self.reports / "train.json"

    @property
    def check_report(self) -> Path:
        return self.reports / "check.json"

    @property
    def check_details(self) -> Path:
        return self.reports / "check_details.json"

    @property
    def diagnosis(self) -> Path:
        """The diagnosis of a failed check (JSON; its text summary beside it)."""
        return self.reports / "diagnosis.json"

    @property
    def diagnosis_text(self) -> Path:
        return self.reports / "diagnosis.txt"

    @property
    def bench_report(self) -> Path:
        return self.reports / "bench.json"

    @property
    def bench_details(self) -> Path:
        return self.reports / "bench_details.json"

    @property
    def plots(self) -> Path:
        """Plot data for ``dvc plots`` (one CSV per path), latency.png and speedup.png."""
        return self.reports / "plots"

    @property
    def latency_png(self) -> Path:
        """The bench stage's latency plot (also embedded in the HTML report)."""
        return self.plots / "latency.png"

    @property
    def speedup_png(self) -> Path:
        """The bench stage's speed-up plot (also embedded in the HTML report); absent
        when no speed-up was measured."""
        return self.plots / "speedup.png"

    @property
    def track_report(self) -> Path:
        return self.reports / "track.json"

    @property
    def html_report(self) -> Path:
        return self.reports / "report.html"

    @property
    def perf_verdict(self) -> Path:
        return self.reports / "perf_verdict.json"

    @property
    def compile_cache(self) -> Path:
        """JAX's persistent compilation cache of the stages that compile (not ``bench``:
        vmapcheck.core.runtime.enable_compile_cache). Not a DVC output: it only saves
        compile time, never changes a result."""
        return self.root / ".jax_cache"

    @property
    def stage_entries(self) -> Path:
        """``stages/``: the entry point each dvc.yaml stage runs, one per stage, written by
        ``vmapcheck init`` (the design card's top level)."""
        return self.root / "stages"

    def stage_entry(self, stage: str) -> Path:
        """``stages/<stage>.py``, the ``cmd`` of that stage in dvc.yaml (``python
        stages/<stage>.py``) and a dep of it."""
        return self.stage_entries / f"{stage}.py"

    @property
    def stage_times(self) -> Path:
        """One ``<stage>.json`` per stage: when it last ran and for how long (the
        run's timeline in MLflow)."""
        return self.reports / "stages"

    def stage_time(self, stage: str) -> Path:
        """``reports/stages/<stage>.json``, an out of that stage in dvc.yaml."""
        return self.stage_times / f"{stage}.json"
