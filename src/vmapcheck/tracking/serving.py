"""The verified model as an MLflow pyfunc: ``mlflow.pyfunc.load_model`` and ``mlflow models
serve`` answer requests through the guard, with the params a passing run verified.

:func:`log_verified_model` logs one MLflow model into the verified run (an MLflow 3
logged model whose source run is that run); the registry registers it
(:mod:`vmapcheck.tracking.registry`). The model holds:

- ``artifacts/params/``: the run's params artifact as it was verified
  (params.safetensors, manifest.json, contract.json);
- ``artifacts/serving.json``: what ``predict`` needs of the run's config: the model
  (to build it), the backend and precision (JAX is pinned to them on load), the guard
  (buckets and limits);
- ``code/``: the ``vmapcheck`` package and, for a model built by a factory outside it
  (the root ``models/`` package, a plug-in), that factory's top-level package, so the model
  loads wherever MLflow runs, whatever the working directory;
- ``served_model.py`` (MLflow's "models from code": nothing is pickled): builds a
  :class:`VerifiedModel` holding the sha256 of each artifact file, recorded when the model
  was logged;
- a signature built from the contract (:func:`signature_of`): one tensor per input leaf
  and one output tensor, batch axis first, of size -1.

On load (:meth:`VerifiedModel.load_context`) every artifact file is checked against its
sha256, then the params against the model and its contract, before a
:class:`~vmapcheck.guard.predictor.Guard` is built. MLflow checks each request against the
signature (shapes, dtypes) before ``predict`` runs; ``predict`` sends it through the
guard: limits and contract (batch size, bytes, dtype, NaN or Inf, ids in range), then
padding to a bucket and one compiled vmapped forward per bucket.

A request the guard refuses raises :class:`RequestRefused`, an ``MlflowException`` with
error code ``INVALID_PARAMETER_VALUE``: MLflow's scoring server answers it with HTTP 400
and the guard's message, which names shapes, counts and positions, never a value.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from vmapcheck.config import BackendConfig, Config, GuardConfig, ModelConfig, PrecisionConfig
from vmapcheck.core.contract import VECTOR_LEAF, InputSpec, Leaf, leaf_arrays
from vmapcheck.errors import ArtifactError, InvalidInputError, NonFiniteOutputError
from vmapcheck.io import read_json, sha256_file
from vmapcheck.layout import CONTRACT_FILE, MANIFEST_FILE, PARAMS_FILE
from vmapcheck.tracking import request_body
from vmapcheck.tracking.request_body import BodyRule

with warnings.catch_warnings():
    # MLflow 3.17 warns while importing its own agent request types (an `Any` field it
    # cannot validate): nothing of ours, and noise in every track and served model.
    warnings.filterwarnings("ignore", message=".*Any type hint is inferred as AnyType")
    import mlflow.pyfunc
    from mlflow.pyfunc.model import PythonModel

# The model's name within its run (MLflow 3 logged model ``name``).
MODEL_NAME = "model"
# Artifact names (``context.artifacts``): the params folder and the serving settings.
PARAMS_ARTIFACT = "params"
SETTINGS_ARTIFACT = "serving"
SETTINGS_FILE = "serving.json"
# Where the params files lie inside the logged model (the registry records it on a version).
PARAMS_PATH = f"artifacts/{PARAMS_ARTIFACT}"
# Each artifact file the model checks on load, by its path under ``artifacts/``.
CHECKED_FILES = (
    f"{PARAMS_ARTIFACT}/{PARAMS_FILE}",
    f"{PARAMS_ARTIFACT}/{MANIFEST_FILE}",
    f"{PARAMS_ARTIFACT}/{CONTRACT_FILE}",
    SETTINGS_FILE,
)
# Extras of the vmapcheck distribution that are never needed to serve a model.
_DEV_EXTRAS = ("dev",)


class RequestRefused(MlflowException):
    """A request the guard or the contract refused: HTTP 400 from MLflow's scoring server.

    ``reason`` is the guard's category (:data:`vmapcheck.guard.predictor.REASONS`, or
    ``non_finite_output``). The server rewrites an exception's ``message`` to start with
    the request's values (``Failed to predict data '<the whole request>'``) before it
    serializes it; this exception serializes its own message instead, so a response
    never carries a request value (inputs may be personal data).
    """

    def __init__(self, message: str, reason: str, error_code: int = INVALID_PARAMETER_VALUE):
        super().__init__(message, error_code=error_code)
        self.refusal = message
        self.reason = reason

    def serialize_as_json(self) -> str:
        return json.dumps(
            {"error_code": self.error_code, "message": self.refusal, "reason": self.reason}
        )


# --- what the model is made of ------------------------------------------------------------


def serving_settings(config: Config) -> dict[str, Any]:
    """What ``predict`` needs of the run's config, JSON-able (``serving.json``)."""
    return {
        "model": config.model.model_dump(),
        # The guard runs on one device: the data-parallel mesh size is not needed.
        "backend": {"name": config.backend.name, "platform": config.backend.platform},
        "precision": config.precision.model_dump(),
        "guard": config.guard.model_dump(),
    }


def input_spec(contract: Mapping[str, Any]) -> InputSpec:
    """The input contract recorded in contract.json (``params_io.model_contract``)."""
    inputs = contract["inputs"]
    if "leaves" not in inputs:
        return InputSpec.vector(int(inputs["n_features"]))
    return InputSpec(
        tuple(
            Leaf(
                about["leaf"],
                tuple(int(n) for n in about["shape"]),
                about["dtype"],
                int(about["range"][1]) + 1 if "range" in about else None,
                about.get("meaning", ""),
            )
            for about in inputs["leaves"]
        )
    )


def wire_dtype(precision_dtype: str) -> np.dtype:
    """The float dtype requests and outputs have on the wire: the run's dtype, except
    bfloat16, which no JSON reader or numpy-only client has (float32, cast on arrival)."""
    return np.dtype(np.float64 if precision_dtype == "float64" else np.float32)


def signature_of(contract: Mapping[str, Any], precision_dtype: str) -> Any:
    """The MLflow signature of the contract: one ``TensorSpec`` per input leaf, shape
    ``(-1, *leaf shape)`` (batch axis 0, any size), named after the leaf when the example is
    a dict of leaves, unnamed for a flat vector ``(-1, in_features)``; one output tensor
    ``(-1, out_features)``. Float tensors are :func:`wire_dtype`; ids int32, masks bool.
    """
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema, TensorSpec

    spec = input_spec(contract)
    wire = wire_dtype(precision_dtype)

    def dtype(leaf: Leaf) -> np.dtype:
        return wire if leaf.dtype == "float" else np.dtype(leaf.dtype)

    if spec.flat:
        inputs: list[ColSpec | TensorSpec] = [TensorSpec(wire, (-1, spec.leaves[0].size))]
    else:
        inputs = [TensorSpec(dtype(leaf), (-1, *leaf.shape), leaf.name) for leaf in spec.leaves]
    outputs: list[ColSpec | TensorSpec] = [
        TensorSpec(wire, (-1, int(contract["outputs"]["n_outputs"])))
    ]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def _factory_package(model: ModelConfig) -> str | None:
    """The top-level package of the model's factory when it lies outside vmapcheck."""
    if model.factory is None:
        return None
    top = str(model.factory["_target_"]).split(".", 1)[0]
    return None if top == "vmapcheck" else top


# Copied into a served model without these (compiled files are rebuilt where it loads).
CODE_SKIPPED = ("__pycache__", "*.pyc")


def code_sources(model: ModelConfig) -> list[Path]:
    """The code a served model carries: the vmapcheck package, and the factory's top-level
    package (its folders) or module when it is not vmapcheck.

    Raises:
        ArtifactError: the factory's package cannot be found.
    """
    # The package's folder, this file's grandparent (not ``import vmapcheck``: the
    # package's top imports every floor, and tracking sits below it).
    sources = [Path(__file__).resolve().parents[1]]
    top = _factory_package(model)
    if top is not None:
        spec = importlib.util.find_spec(top)
        if spec is None or not (spec.submodule_search_locations or spec.origin):
            raise ArtifactError(
                f"model.factory._target_={(model.factory or {}).get('_target_')!r}: package "
                f"{top!r} not found on sys.path; the served model must carry its code"
            )
        if spec.submodule_search_locations:
            sources += [Path(p) for p in spec.submodule_search_locations]
        else:
            sources.append(Path(str(spec.origin)))
    return sources


def code_digest(model: ModelConfig) -> str:
    """sha256 over every file :func:`package_code` copies (its path within its source and
    its bytes, in sorted order): equal digests, the same code served."""
    digest = hashlib.sha256()
    for source in code_sources(model):
        files = [source] if source.is_file() else sorted(source.rglob("*"))
        for path in files:
            relative = path.relative_to(source.parent)
            # As shutil.ignore_patterns skips them: any part of the path matching.
            skipped = any(fnmatch(part, p) for part in relative.parts for p in CODE_SKIPPED)
            if skipped or not path.is_file():
                continue
            digest.update(f"{relative.as_posix()}\0".encode())
            digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def package_code(model: ModelConfig, dest: Path) -> list[str]:
    """Copy the code the model needs (:func:`code_sources`) into ``dest`` (without
    ``__pycache__``); the paths to pass as ``code_paths``.

    Raises:
        ArtifactError: the factory's package cannot be found.
    """
    skip = shutil.ignore_patterns(*CODE_SKIPPED)
    paths = []
    for source in code_sources(model):
        target = Path(dest) / source.name
        if source.is_dir():
            # A namespace package may have several folders: they merge into one.
            shutil.copytree(source, target, ignore=skip, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
        if str(target) not in paths:
            paths.append(str(target))
    return paths


def pip_requirements(model: ModelConfig) -> list[str]:
    """vmapcheck's pinned requirements, and those of an extra (flax, equinox) whose
    package the model's factory imports: what another environment needs to serve it
    (``--env-manager local`` uses the current one). Given explicitly, MLflow does not
    load the model in a subprocess to infer them."""
    if model.factory is not None:
        importlib.import_module(str(model.factory["_target_"]).rsplit(".", 1)[0])
    try:
        declared = importlib.metadata.requires("vmapcheck") or []
    except importlib.metadata.PackageNotFoundError:
        raise ArtifactError(
            "the vmapcheck distribution is not installed (pip install -e .): its pinned "
            "requirements are the served model's"
        ) from None
    found = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        name = re.split(r"[<>=!~\[ ]", requirement.strip(), maxsplit=1)[0]
        if extra is None or (
            extra.group(1) not in _DEV_EXTRAS and name.replace("-", "_") in sys.modules
        ):
            found.append(requirement.strip())
    return found


# The model's code file (MLflow "models from code"): it builds the VerifiedModel with the
# digests recorded at logging time, so nothing of the model is pickled.
MODEL_CODE = '''"""vmapcheck's verified model, written when it was logged
(vmapcheck.tracking.serving): the sha256 of each artifact file, checked on load."""

from mlflow.models import set_model

from vmapcheck.tracking.serving import VerifiedModel

set_model(VerifiedModel({digests}))
'''
MODEL_CODE_FILE = "served_model.py"


def log_verified_model(
    tracking_uri: str, run_id: str, params_folder: Path, config: Config
) -> dict[str, str]:
    """Log the pyfunc of the params in ``params_folder`` (already verified: the run's
    ``params/`` artifact) into run ``run_id``: a logged model of that run's experiment,
    with the run as its source and among the run's outputs.

    The steps of ``mlflow.pyfunc.log_model``, with the store named explicitly (it would
    read the global tracking URI and the active experiment) and without copying every
    metric of the run onto the model (about a thousand queries for a vmapcheck run).

    Returns:
        {"model_id", "model_uri" (``models:/<model_id>``), "artifact_location" (the logged
        model's artifact folder: its ``MLmodel`` lies there)}.

    Raises:
        ArtifactError: a params file is missing, or the factory's code cannot be found.
        MlflowException: the store refused.
    """
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model
    from mlflow.tracking import MlflowClient

    params_folder = Path(params_folder)
    contract = read_json(params_folder / CONTRACT_FILE)
    client = MlflowClient(tracking_uri=tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Path(tmp) / SETTINGS_FILE
        settings.write_text(json.dumps(serving_settings(config), indent=2, sort_keys=True))
        files = {
            f"{PARAMS_ARTIFACT}/{name}": params_folder / name
            for name in (PARAMS_FILE, MANIFEST_FILE, CONTRACT_FILE)
        } | {SETTINGS_FILE: settings}
        for relative, path in files.items():
            if not path.is_file():
                raise ArtifactError(f"{path}: not found (the served model's {relative})")
        digests = json.dumps({k: sha256_file(p) for k, p in files.items()}, indent=4)
        model_code = Path(tmp) / MODEL_CODE_FILE
        model_code.write_text(MODEL_CODE.format(digests=digests))
        code = Path(tmp) / "code"
        code.mkdir()
        code_paths = package_code(config.model, code)
        logged = client.create_logged_model(
            experiment_id=client.get_run(run_id).info.experiment_id,
            name=MODEL_NAME,
            source_run_id=run_id,
        )
        try:
            local = Path(tmp) / "model"
            with warnings.catch_warnings():
                # No input example: rows of the data may be personal; the signature gives
                # every shape and dtype.
                warnings.filterwarnings("ignore", message=r".*input example was not provided")
                mlflow.pyfunc.save_model(
                    str(local),
                    mlflow_model=Model(
                        artifact_path=logged.artifact_location,
                        run_id=run_id,
                        model_uuid=logged.model_id,
                        model_id=logged.model_id,
                        metadata={"vmapcheck": {"model": config.model.name, "run_id": run_id}},
                    ),
                    python_model=str(model_code),
                    artifacts={
                        PARAMS_ARTIFACT: str(params_folder),
                        SETTINGS_ARTIFACT: str(settings),
                    },
                    code_paths=code_paths,
                    signature=signature_of(contract, config.precision.dtype),
                    pip_requirements=pip_requirements(config.model),
                )
            client.log_model_artifacts(logged.model_id, str(local))
            client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        except BaseException:
            client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
            raise
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    return {
        "model_id": logged.model_id,
        "model_uri": f"models:/{logged.model_id}",
        "artifact_location": logged.artifact_location.rstrip("/"),
    }


# --- the pyfunc --------------------------------------------------------------------------


def _artifact_file(artifacts: Mapping[str, str], relative: str) -> Path:
    """The local path of a checked file (:data:`CHECKED_FILES`) from ``context.artifacts``."""
    if relative == SETTINGS_FILE:
        return Path(artifacts[SETTINGS_ARTIFACT])
    return Path(artifacts[PARAMS_ARTIFACT]) / relative.split("/", 1)[1]


def _in_scoring_server() -> bool:
    """Whether this process is MLflow's scoring server loading its model (``mlflow models
    serve`` names the model in this variable for the app module it starts)."""
    from mlflow.pyfunc import scoring_server

    return scoring_server._SERVER_MODEL_PATH in os.environ


def body_rule(contract: Mapping[str, Any], spec: InputSpec, max_batch: int) -> BodyRule:
    """What an HTTP body must hold (:mod:`vmapcheck.tracking.request_body`): the contract's
    feature names for a flat model, else each leaf's values per row."""
    if spec.flat:
        return BodyRule(tuple(contract["inputs"]["features"]), None, max_batch)
    return BodyRule(None, {leaf.name: leaf.size for leaf in spec.leaves}, max_batch)


class VerifiedModel(PythonModel):
    """Verified params served through the guard (:class:`vmapcheck.guard.predictor.Guard`).

    Args:
        sha256: the digest of each artifact file (:data:`CHECKED_FILES`), recorded when
            the model is logged; :meth:`load_context` refuses a file that differs.

    ``predict`` takes what the signature says: for a flat-vector model a 2-D float array
    (or a DataFrame of ``in_features`` columns, in the contract's feature order) of shape
    ``(batch, in_features)``; for a model whose example is a dict of leaves, a dict of
    arrays ``{leaf: (batch, *leaf shape)}``. It returns ``(batch, out_features)``, batch
    axis 0, in the wire dtype (float32, or float64 for a float64 run).
    """

    # The signature comes from the contract (signature_of), not from predict's type hints:
    # this attribute switches off MLflow's inspection of a subclass's predict (it warns on
    # import when it finds no type hint there), as MLflow does for its own ChatModel.
    _skip_type_hint_validation = True

    def __init__(self, sha256: Mapping[str, str]) -> None:
        missing = [name for name in CHECKED_FILES if name not in sha256]
        if missing:
            raise ArtifactError(f"VerifiedModel: no sha256 recorded for {missing}")
        self.sha256 = dict(sha256)
        self._guard: Any = None
        self._lock: Any = None
        self.body_rule: BodyRule | None = None

    def load_context(self, context: Any) -> None:
        """:meth:`_load` it; in MLflow's scoring server (``mlflow models serve``), a refusal
        ends the process with that one line instead of a traceback.

        Raises:
            ArtifactError, BackendUnavailableError: see :meth:`_load` (outside a server).
            SystemExit: in a scoring server, with the refusal as its message.
        """
        from vmapcheck.errors import VmapcheckError

        try:
            self._load(context)
        except VmapcheckError as exc:
            if _in_scoring_server():
                # uvicorn imports MLflow's app module, which loads the model: an exception
                # there is printed with ~85 lines of MLflow's and uvicorn's frames around
                # the one that matters. SystemExit prints only its message.
                raise SystemExit(f"vmapcheck: the model was not served: {exc}") from None
            raise

    def _load(self, context: Any) -> None:
        """Check every artifact file's sha256, pin JAX to the run's backend and precision,
        load and check the params, and build the guard (compiling every bucket when
        ``guard.precompile``).

        Raises:
            ArtifactError: a file is missing or differs from its recorded sha256 (naming
                it), or the params or contract do not fit the model.
            BackendUnavailableError: the run's backend is not present here.
        """
        import jax

        from vmapcheck.core.models import build_model
        from vmapcheck.core.runtime import configure_jax
        from vmapcheck.guard.predictor import Guard
        from vmapcheck.params_io import check_contract, contract_of, load_params

        for relative in CHECKED_FILES:
            path = _artifact_file(context.artifacts, relative)
            if not path.is_file():
                raise ArtifactError(f"served model: artifacts/{relative}: not found; refused")
            found = sha256_file(path)
            if found != self.sha256[relative]:
                raise ArtifactError(
                    f"served model: artifacts/{relative}: sha256 check failed: "
                    f"{self.sha256[relative]} was recorded when the model was logged, the file "
                    f"is {found} (changed since); refused"
                )
        settings = read_json(_artifact_file(context.artifacts, SETTINGS_FILE))
        backend = BackendConfig(**settings["backend"], num_devices=None)
        precision = PrecisionConfig.model_validate(settings["precision"])
        guard = GuardConfig.model_validate(settings["guard"])
        model_config = ModelConfig.model_validate(settings["model"])
        configure_jax(backend, precision)
        model = build_model(model_config)
        folder = Path(context.artifacts[PARAMS_ARTIFACT])
        contract = read_json(folder / CONTRACT_FILE)
        template = jax.eval_shape(model.init, jax.random.key(0))
        try:
            if contract.get("model") != model.name:
                raise ArtifactError(
                    f"params are of model {contract.get('model')!r}, serving.json builds "
                    f"{model.name!r}"
                )
            check_contract(contract.get("params", {}), contract_of(template))
            recorded, built = input_spec(contract).describe(), model.contract.describe()
            if recorded != built:
                raise ArtifactError(f"the contract's inputs {recorded} are not the model's {built}")
            params, _ = load_params(folder, template)
        except ArtifactError as exc:
            raise ArtifactError(f"served model: artifacts/{PARAMS_ARTIFACT}: {exc}") from None
        self._spec = model.contract
        self._dtype = jax.numpy.dtype(precision.dtype)
        self._wire = wire_dtype(precision.dtype)
        self._guard = Guard(model, params, self._dtype, guard)
        self.body_rule = body_rule(contract, model.contract, guard.max_batch)
        # HTTP bodies are read by name and bounded before MLflow parses them.
        request_body.install()
        # The scoring server runs each request in a thread; one guard serves one at a time.
        self._lock = threading.Lock()

    def _request(self, model_input: Any) -> Any:
        """The guard's input: a DataFrame as its array; float leaves in the wire dtype cast
        to the run's dtype (bfloat16); anything else as it is, for the guard to judge."""
        import pandas as pd

        if isinstance(model_input, pd.DataFrame):
            model_input = (
                model_input.to_numpy()
                if self._spec.flat
                else {name: np.stack(model_input[name].to_numpy()) for name in model_input}
            )
        if self._dtype == self._wire:
            return model_input
        arrays = leaf_arrays(model_input) if isinstance(model_input, Mapping) else None
        floats = {leaf.name for leaf in self._spec.leaves if leaf.dtype == "float"}

        def cast(name: str, leaf: Any) -> Any:
            is_wire = isinstance(leaf, np.ndarray) and leaf.dtype == self._wire
            return leaf.astype(self._dtype) if name in floats and is_wire else leaf

        if arrays is None:
            return cast(VECTOR_LEAF, model_input)
        return {name: cast(name, leaf) for name, leaf in arrays.items()}

    # model_input has no annotation: MLflow would try to build a signature from it when the
    # model is logged (and warn that it cannot); the contract's signature is given instead.
    def predict(self, context: Any, model_input, params: Any = None) -> np.ndarray:
        """Outputs ``(batch, out_features)`` for a request (see the class docstring).

        Raises:
            RequestRefused: the request breaks a limit or the contract (HTTP 400), or the
                model returned NaN or Inf for a row (HTTP 500); the message names shapes,
                counts and positions, never a value.
        """
        if self._guard is None:
            raise MlflowException(
                "VerifiedModel.predict before load_context", error_code=INTERNAL_ERROR
            )
        try:
            with self._lock:
                out = self._guard.predict(self._request(model_input))
        except InvalidInputError as exc:
            raise RequestRefused(f"request refused: {exc}", exc.reason) from None
        except NonFiniteOutputError as exc:
            raise RequestRefused(
                f"no output: {exc}", "non_finite_output", error_code=INTERNAL_ERROR
            ) from None
        return np.asarray(out, dtype=self._wire)
