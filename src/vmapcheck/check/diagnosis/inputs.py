"""Stages 1-3: the inputs of the computation, before any forward is compared.

1. ``data``: the stored cases and prepared splits re-derive from the raw source, and the
   model's own preprocessing steps agree between the paths;
2. ``key_stream``: each named subkey feeds one random draw (also run by the check);
3. ``shapes``: the params tree and every layer's shape and dtype in every path.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.errors import KeyReuseError

from vmapcheck.check.diagnosis._layers import evaluate_probe, layered_paths, walk_layers
from vmapcheck.check.diagnosis.subject import (
    DataSources,
    Probe,
    Subject,
    error_line,
    feeding_leaves,
    layer_of,
    make_finding,
    stage_result,
)
from vmapcheck.check.schema import Evidence
from vmapcheck.core.compare import exact
from vmapcheck.core.contract import rows as batch_rows
from vmapcheck.core.forms import OUTPUT
from vmapcheck.core.keys import KEY_NAMES, named_keys
from vmapcheck.core.models import Model, Params
from vmapcheck.core.state import declared_state
from vmapcheck.data.anonymize import AnonymizePolicy, anonymize
from vmapcheck.data.regression import CASES_MANIFEST, SPLITS, regression_cases, x_arrays
from vmapcheck.data.splits import load_raw, split_indices
from vmapcheck.errors import VmapcheckError
from vmapcheck.io import load_npz, read_json, sha256_file
from vmapcheck.params_io import contract_of, leaf_paths

if TYPE_CHECKING:
    from vmapcheck.check.schema import CheckDetails, Finding, StageResult

# Two params leaves whose first values correlate this closely are one random draw:
# independent draws of n >= MIN_DRAW values correlate by about 1/sqrt(n).
SAME_DRAW = 1.0 - 1e-4
MIN_DRAW = 8


# --- 1. data and preprocessing --------------------------------------------------------


def _split_arrays(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    return {name: load_npz(folder / f"{name}.npz") for name in SPLITS}


def _first_feature(result: Mapping[str, Any], features: list[str]) -> str | None:
    """The feature (column) of the worst element of ``exact``'s ``result``, if known."""
    element = result.get("element")
    if element and features and len(element) >= 1 and element[-1] < len(features):
        return features[element[-1]]
    return None


def _data_mismatch(
    evidence: list[Evidence],
    stored: np.ndarray,
    derived: np.ndarray,
    *,
    checked: str,
    what: str,
    layer: str,
    features: list[str] | None,
    claim: str,
    cause: str,
) -> Finding | None:
    """Compare a stored array with its re-derivation bit for bit and record the evidence
    (``checked``: what was compared). On a difference, the data stage's finding: "<claim>
    (<reason>[, feature <name>]): <cause>", the feature named from ``features`` (the
    columns of a (rows, features) array; None for other arrays)."""
    result = exact(stored, derived)
    evidence.append({"what": checked, **result})
    if result["passed"]:
        return None
    feature = _first_feature(result, features) if features is not None else None
    return make_finding(
        "data",
        f"{claim} ({result['reason']}"
        + (f", feature {feature}" if feature else "")
        + f"): {cause}",
        what=what,
        layer=layer,
        figures=result,
        feature=feature,
    )


def data_stage(sources: DataSources | None, subject: Subject | None = None) -> StageResult:
    """Stage 1: the stored data are what the preprocessing makes of the raw source, and
    the model's own preprocessing steps agree between the paths.

    In order: every case file against its manifest sha256; every case (x and y)
    against :func:`regression_cases` re-run on the prepared splits; every prepared row
    against the raw source's row it came from (anonymization keeps features and
    targets unchanged; a step applied twice shows here), and each split's rows against
    :func:`split_indices` re-run from the key stream's ``split`` subkey; then, for a
    model that declares ``preprocessing`` activations, those steps across the paths
    (eager, minimal input first). All stored-data comparisons are exact.
    """
    evidence: list[Evidence] = []
    if sources is not None:
        finding = _stored_data(sources, evidence)
        if finding is not None:
            return stage_result("data", evidence, finding)
    if subject is not None and subject.model.preprocessing:
        steps = set(subject.model.preprocessing)
        for probe in subject.probes:
            runs = evaluate_probe(subject, probe, jit=False)
            finding = walk_layers(
                "data", subject, probe, runs, steps.__contains__, evidence, "eager"
            )
            if finding is not None:
                return stage_result("data", evidence, finding)
    if sources is None and not (subject is not None and subject.model.preprocessing):
        return stage_result("data", evidence, skipped="no stored data given and no preprocessing")
    parts = []
    if sources is not None:
        parts.append(
            "case files match their manifest; cases re-derive from the prepared splits; "
            "prepared rows equal the raw rows they came from"
        )
    if subject is not None and subject.model.preprocessing:
        parts.append(f"preprocessing {', '.join(subject.model.preprocessing)} agrees in every path")
    elif subject is not None:
        parts.append("the model declares no preprocessing of its own")
    return stage_result("data", evidence, summary="; ".join(parts))


def _stored_data(sources: DataSources, evidence: list[Evidence]) -> Finding | None:
    manifest = read_json(sources.cases / CASES_MANIFEST)
    features = list(manifest.get("features", []))
    stored: dict[str, dict[str, np.ndarray]] = {}
    for name, entry in manifest["cases"].items():
        path = sources.cases / entry["file"]
        found = sha256_file(path) if path.is_file() else "missing"
        ok = found == entry["sha256"]
        evidence.append(
            {"what": f"cases/{entry['file']} sha256 against the manifest", "passed": ok}
        )
        if not ok:
            return make_finding(
                "data",
                f"cases/{entry['file']} does not match its manifest (sha256 "
                f"{'missing file' if found == 'missing' else 'differs'}): the case was "
                "changed after prepare wrote it",
                what="case file",
                layer=f"cases/{entry['file']}",
            )
        stored[name] = load_npz(path)
    splits = _split_arrays(sources.prepared)
    derived = regression_cases(
        splits["train"]["features"],
        splits["test"]["features"],
        splits["test"]["targets"],
        sources.config.standard_batch,
        sources.contract,
        features,
    )
    if set(derived) != set(stored):
        return make_finding(
            "data",
            f"the stored cases {sorted(stored)} are not the cases prepare makes {sorted(derived)}",
            what="case set",
        )
    for name, case in derived.items():
        made = {**x_arrays(case["x"]), **({"y": case["y"]} if "y" in case else {})}
        for key in sorted(set(made) | set(stored[name])):
            if (key in made) != (key in stored[name]):
                return make_finding(
                    "data",
                    f"case {name}: {key} stored and re-derived differ in presence",
                    what="case",
                    layer=f"cases.{name}.{key}",
                )
            finding = _data_mismatch(
                evidence,
                stored[name][key],
                made[key],
                checked=f"cases.{name}.{key} re-derived from the prepared splits",
                what="case array",
                layer=f"cases.{name}.{key}",
                features=features if key == "x" else None,
                claim=f"case {name}: stored {key} differs from {key} re-derived from the "
                "prepared splits",
                cause="a step was applied to the cases that prepare does not apply "
                "(or applied twice)",
            )
            if finding:
                return finding
    return _raw_rows(sources, splits, features, evidence)


def _raw_rows(
    sources: DataSources,
    splits: dict[str, dict[str, np.ndarray]],
    features: list[str],
    evidence: list[Evidence],
) -> Finding | None:
    config = sources.config
    # Exactly prepare's numerics (configure_cpu_float32): the same bits come out.
    with jax.enable_x64(False), jax.default_matmul_precision("highest"):
        keys = named_keys(sources.seed)
        try:
            raw = load_raw(config, keys["data"], sources.root)
            group_ids = anonymize(
                raw,
                AnonymizePolicy(
                    # Pseudonyms are not needed to compare numbers: no secret is read.
                    join_key=None,
                    secret_env=config.anonymize.secret_env,
                    group_by=config.anonymize.group_by,
                ),
            ).group_ids
            parts = split_indices(keys["split"], group_ids, config)
        except VmapcheckError as exc:
            evidence.append(
                {"what": "raw source re-read", "passed": None, "reason": error_line(exc)}
            )
            return None
    for split in SPLITS:
        rows = splits[split]["row"]
        result = exact(rows, parts[split])
        evidence.append({"what": f"prepared/{split} rows re-derived from key 'split'", **result})
        if not result["passed"]:
            return make_finding(
                "data",
                f"the rows of the prepared {split} split are not those split_indices draws "
                "from the key stream's 'split' subkey",
                what="split rows",
                layer=f"prepared.{split}.row",
            )
        for key, block in (("features", raw.features), ("targets", raw.targets)):
            finding = _data_mismatch(
                evidence,
                splits[split][key],
                block[rows],
                checked=f"prepared.{split}.{key} against the raw rows",
                what="prepared array",
                layer=f"prepared.{split}.{key}",
                features=features if key == "features" else None,
                claim=f"prepared {split} {key} differ from the raw source's rows",
                cause="anonymization keeps the numbers, so a preprocessing step changed "
                "them (or ran twice)",
            )
            if finding:
                return finding
    return None


# --- 2. key stream --------------------------------------------------------------------


def _random_leaves(params: Params, elsewhere: Params) -> dict[str, np.ndarray]:
    """Leaves that hold random draws: floating, at least MIN_DRAW values, not constant,
    and changed in ``elsewhere`` (init from another key). A leaf the key does not move
    (an identity matrix, a fixed table) is no draw, however it correlates."""
    other = leaf_paths(elsewhere)
    out = {}
    for name, leaf in leaf_paths(params).items():
        host = np.asarray(leaf)
        if jnp.issubdtype(host.dtype, jnp.floating) and host.size >= MIN_DRAW:
            flat = host.astype(np.float64).ravel()
            moved = not np.array_equal(host, np.asarray(other.get(name)))
            if np.all(np.isfinite(flat)) and flat.std() > 0 and moved:
                out[name] = flat
    return out


def _correlation(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Correlation of the first min(len) values: a key reused for two draws gives the
    same random bits position by position (threefry counts through the flat index), so
    the shared prefix correlates exactly, whatever each draw's scale."""
    n = min(a.size, b.size)
    x, y = a[:n] - a[:n].mean(), b[:n] - b[:n].mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return (float((x * y).sum() / denom) if denom > 0 else 0.0), n


def key_stream_stage(model: Model, seed: int | None) -> StageResult:
    """Stage 2: each named subkey feeds one random draw.

    Evidence: :func:`named_keys` twice gives the same keys, and the subkeys differ
    pairwise; ``model.init(keys['init'])`` under ``jax_debug_key_reuse`` consumes no key
    twice; two calls give identical params (init depends on its key alone); no two
    params leaves (declared state leaves aside: statistics computed, not drawn) repeat one
    draw (their first values correlate to 1 within
    :data:`SAME_DRAW`: a key reused by value, e.g. the same ``fold_in`` for every layer,
    which the reuse checker cannot see). Runs as prepare and train do (float32, no x64).
    Used by the check itself (a reused key fails it) and as the diagnosis' stage 2.
    """
    evidence: list[Evidence] = []
    if seed is None:
        return stage_result("key_stream", evidence, skipped="no seed given")
    with jax.enable_x64(False), jax.default_matmul_precision("highest"):
        finding = _named_keys_finding(seed, evidence)
        if finding is not None:
            return stage_result("key_stream", evidence, finding)
        params, repeat, elsewhere, reuse = _init_under_reuse_checker(model, seed, evidence)
    pure = all(
        np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(repeat), strict=True)
    )
    evidence.append({"what": "init twice from the same key gives the same params", "passed": pure})
    # Declared state (running statistics) is computed from draws, not drawn: mean and
    # variance of one calibration batch may well correlate, by design.
    draws = {
        name: values
        for name, values in _random_leaves(params, elsewhere).items()
        if not declared_state(model, name)
    }
    finding = _repeated_draw(draws, reuse, evidence) or _init_finding(reuse, pure)
    return stage_result(
        "key_stream",
        evidence,
        finding,
        summary=f"{len(KEY_NAMES)} named subkeys reproducible and distinct; init consumes "
        f"no key twice and repeats no draw across {len(draws)} random leaves",
    )


def _named_keys_finding(seed: int, evidence: list[Evidence]) -> Finding | None:
    """The named subkeys re-derive from ``seed`` and differ pairwise, or the finding."""
    first, again = named_keys(seed), named_keys(seed)
    data = {n: np.asarray(jax.random.key_data(k)) for n, k in first.items()}
    same = all(np.array_equal(data[n], jax.random.key_data(again[n])) for n in KEY_NAMES)
    evidence.append({"what": "named subkeys re-derived from the seed", "passed": same})
    if not same:
        return make_finding("key_stream", "named_keys(seed) is not reproducible", what="keys")
    for left, right in combinations(KEY_NAMES, 2):
        distinct = not np.array_equal(data[left], data[right])
        evidence.append({"what": f"subkeys {left!r} and {right!r} differ", "passed": distinct})
        if not distinct:
            return make_finding(
                "key_stream",
                f"the named subkeys {left!r} and {right!r} are the same key",
                what="keys",
                layer=f"keys.{right}",
            )
    return None


def _init_under_reuse_checker(
    model: Model, seed: int, evidence: list[Evidence]
) -> tuple[Params, Params, Params, str | None]:
    """``model.init`` twice from the ``init`` key of ``seed`` and once from ``seed + 1``'s,
    under ``jax_debug_key_reuse``: the three params and the checker's complaint (None: none)."""
    reuse = None
    try:
        with jax.debug_key_reuse(True):
            params = jax.block_until_ready(model.init(named_keys(seed)["init"]))
            repeat = model.init(named_keys(seed)["init"])
            elsewhere = model.init(named_keys(seed + 1)["init"])
    except KeyReuseError as exc:
        reuse = error_line(exc)
        # Drawn again without the checker, to name the leaves that share a key.
        with jax.debug_key_reuse(False):
            params = model.init(named_keys(seed)["init"])
            repeat = model.init(named_keys(seed)["init"])
            elsewhere = model.init(named_keys(seed + 1)["init"])
    evidence.append(
        {"what": "init under jax_debug_key_reuse", "passed": reuse is None, "reason": reuse}
    )
    return params, repeat, elsewhere, reuse


def _repeated_draw(
    draws: dict[str, np.ndarray], reuse: str | None, evidence: list[Evidence]
) -> Finding | None:
    """The first pair of random leaves (flat values) that repeat one draw, as a finding."""
    names = list(draws)
    for i, later in enumerate(names):
        for earlier in names[:i]:
            corr, n = _correlation(draws[earlier], draws[later])
            repeated = abs(corr) >= SAME_DRAW and n >= MIN_DRAW
            evidence.append(
                {
                    "what": f"init draws {earlier} and {later} independent",
                    "correlation": corr,
                    "values": n,
                    "passed": not repeated,
                }
            )
            if repeated:
                return make_finding(
                    "key_stream",
                    f"init draws {later} with the key already used for {earlier}: their "
                    f"first {n} values correlate {corr:.6f} (one PRNG key fed both)"
                    + (f"; the reuse checker also saw it ({reuse})" if reuse else ""),
                    what="reused PRNG key",
                    layer=layer_of(later),
                    leaf=later,
                    params_leaves=[earlier, later],
                    key="init",
                )
    return None


def _init_finding(reuse: str | None, pure: bool) -> Finding | None:
    """init consumed a key twice (the checker's ``reuse``), or is not ``pure``: the finding."""
    if reuse is not None:
        return make_finding(
            "key_stream",
            f"init consumed a PRNG key twice ({reuse})",
            what="reused PRNG key",
            layer="init",
            key="init",
        )
    if not pure:
        return make_finding(
            "key_stream",
            "init gives different params from the same key: it draws randomness "
            "outside the key stream (a global RNG, the clock)",
            what="impure init",
            layer="init",
            key="init",
        )
    return None


# --- 3. shapes and dtypes -------------------------------------------------------------


Forms = dict[str, tuple[list[str], list[Any], str]]
"""Each form's layer names, their abstract activations and its trace error on one probe."""


def _abstract(subject: Subject, probe: Probe) -> Forms:
    """Each form's activation shapes/dtypes on ``probe``, traced, not computed."""
    params = subject.run_params
    x, _ = subject.inputs(probe)
    out: Forms = {}
    for entry in layered_paths(jit=False):
        path = entry.name
        assert entry.activations is not None  # layered_paths keeps those that have them
        activations = entry.activations(subject.model)
        if activations is None:
            continue
        layers, per_layer = activations
        try:
            structs = jax.eval_shape(layers, params, x)
            names = list(layers.names)
            out[path] = (names, structs, "")
        except Exception as exc:
            out[path] = ([], [], error_line(exc))
        if not per_layer and path in out and not out[path][2]:
            out[path] = ([OUTPUT], out[path][1][-1:], "")
    return out


def shapes_stage(subject: Subject, check: CheckDetails | None = None) -> StageResult:
    """Stage 3: tree structure and every leaf; every layer's shape and dtype per path.

    Params against ``jax.eval_shape(model.init)`` (structure, then each leaf's shape and
    dtype); then, for each probe, each form's activations (abstract evaluation): the
    same layer names, the same shape and dtype at every layer as the loop's, and an
    output of (rows, out_features) in the run's dtype; then the check's recorded output
    contract and refusals of invalid inputs.
    """
    evidence: list[Evidence] = []
    template = jax.eval_shape(subject.model.init, jax.random.key(0))
    finding = _params_tree(subject.params, template, evidence)
    for probe in subject.probes:
        if finding is not None:
            break
        finding = _probe_shapes(subject, probe, evidence)
    if finding is None:
        finding = _recorded_contract(check, evidence)
    return stage_result(
        "shapes",
        evidence,
        finding,
        summary=f"params tree and {len(contract_of(template))} leaves match the contract; "
        f"every layer's shape and dtype agree in every path on {len(subject.probes)} input(s)",
    )


def _params_tree(params: Params, template: Params, evidence: list[Evidence]) -> Finding | None:
    """``params`` against the model's ``template`` (abstract): the tree's structure, then
    each leaf's shape and dtype; the first difference as a finding."""
    structure, expected = (
        jax.tree_util.tree_structure(params),
        jax.tree_util.tree_structure(template),
    )
    # (jaxlib's stub leaves PyTreeDef unresolved for mypy: the comparison is its own.)
    same_tree = bool(structure == expected)  # type: ignore[operator]
    evidence.append({"what": "params tree structure against the model's", "passed": same_tree})
    if not same_tree:
        return make_finding(
            "shapes",
            f"params tree structure {jax.tree_util.tree_structure(params)} is "
            f"not the model's {jax.tree_util.tree_structure(template)}",
            what="params tree",
        )
    found, expected = contract_of(params), contract_of(template)
    for leaf, want in expected.items():
        got = found.get(leaf)
        ok = got == want
        evidence.append(
            {"what": f"params leaf {leaf}", "expected": want, "found": got, "passed": ok}
        )
        if not ok:
            return make_finding(
                "shapes",
                f"params leaf {leaf}: expected shape {want['shape']} dtype {want['dtype']}, "
                f"found {got}",
                what="params leaf",
                layer=layer_of(leaf),
                leaf=leaf,
            )
    return None


def _probe_shapes(subject: Subject, probe: Probe, evidence: list[Evidence]) -> Finding | None:
    """Every form traced on ``probe``: it traces, names the same layers as the first
    form, gives each layer the same shape and dtype, and ends in the output contract."""
    rows = batch_rows(probe.x)
    forms = _abstract(subject, probe)
    for form, (_, _, error) in forms.items():
        if error:
            evidence.append({"what": f"{form} traced on {probe.label}", "passed": False})
            return make_finding(
                "shapes",
                f"{form} cannot be traced on {probe.label}: {error}",
                what="path raised",
                input=probe.label,
                paths=[form],
            )
    return (
        _layer_names(forms, probe, evidence)
        or _layer_shapes(subject, forms, probe, evidence)
        or _output_contract(subject, forms, probe, rows, evidence)
    )


def _layer_names(forms: Forms, probe: Probe, evidence: list[Evidence]) -> Finding | None:
    """Each layered form names the same layers as the first form (the reference)."""
    reference_form = next(iter(forms))
    ref_names = forms[reference_form][0]
    layered = {f: v for f, v in forms.items() if v[0] != [OUTPUT] or ref_names == [OUTPUT]}
    for form, (names, _, _) in layered.items():
        ok = names == ref_names
        evidence.append({"what": f"{form} layer names on {probe.label}", "passed": ok})
        if not ok:
            return make_finding(
                "shapes",
                f"{form} names its layers {names}, {reference_form} "
                f"{ref_names}: the paths do not compute the same layers",
                what="layer names",
                input=probe.label,
                paths=[form],
            )
    return None


def _layer_shapes(
    subject: Subject, forms: Forms, probe: Probe, evidence: list[Evidence]
) -> Finding | None:
    """Each form's activation at each layer has the reference form's shape and dtype (a
    form that gives only its output is compared at the last layer)."""
    reference_form = next(iter(forms))
    ref_names, ref_structs, _ = forms[reference_form]
    leaves = list(leaf_paths(subject.params))
    for i, name in enumerate(ref_names):
        last = i == len(ref_names) - 1
        want = ref_structs[i]
        for form, (names, structs, _) in forms.items():
            if names == [OUTPUT] and not last and ref_names != [OUTPUT]:
                continue
            got = structs[-1] if names == [OUTPUT] else structs[i]
            ok = tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
            evidence.append(
                {
                    "what": f"{name} on {probe.label}",
                    "path": form,
                    "shape": list(got.shape),
                    "dtype": str(np.dtype(got.dtype)),
                    "passed": ok,
                }
            )
            if not ok:
                return make_finding(
                    "shapes",
                    f"layer {name} on {probe.label}: {form} gives shape "
                    f"{tuple(got.shape)} {np.dtype(got.dtype).name}, "
                    f"{reference_form} {tuple(want.shape)} "
                    f"{np.dtype(want.dtype).name}",
                    what="activation shape/dtype",
                    input=probe.label,
                    layer=name,
                    params_leaves=feeding_leaves(name, leaves, len(ref_names)),
                    paths=[form],
                    expected={"shape": list(want.shape), "dtype": str(np.dtype(want.dtype))},
                    found={"shape": list(got.shape), "dtype": str(np.dtype(got.dtype))},
                )
    return None


def _output_contract(
    subject: Subject, forms: Forms, probe: Probe, rows: int, evidence: list[Evidence]
) -> Finding | None:
    """The reference form's output is (``rows``: the batch size of ``probe.x``,
    out_features) in the run's dtype (the other forms agree with it by then)."""
    ref_names, ref_structs, _ = next(iter(forms.values()))
    out = ref_structs[-1]
    run_dtype = np.dtype(subject.dtype).name
    contract = (rows, subject.model.out_features)
    ok = tuple(out.shape) == contract and np.dtype(out.dtype).name == run_dtype
    evidence.append({"what": f"output contract on {probe.label}", "passed": ok})
    if ok:
        return None
    return make_finding(
        "shapes",
        f"every path gives an output of shape {tuple(out.shape)} "
        f"{np.dtype(out.dtype).name} on {probe.label}; the contract is "
        f"{contract} {run_dtype}",
        what="output contract",
        input=probe.label,
        layer=ref_names[-1],
    )


def _recorded_contract(check: CheckDetails | None, evidence: list[Evidence]) -> Finding | None:
    if check is None:
        return None
    for case, report in check.get("cases", {}).items():
        for path, problems in report.get("contract", {}).items():
            evidence.append({"what": f"recorded contract {case}/{path}", "passed": not problems})
            if problems:
                return make_finding(
                    "shapes",
                    f"the run's {path} on case {case}: {'; '.join(problems)}",
                    what="output contract",
                    input=f"case {case}",
                    paths=[path],
                )
    for case, refusals in check.get("negative", {}).items():
        for path, entry in refusals.get("paths", {}).items():
            evidence.append({"what": f"refusal {case}/{path}", "passed": entry["passed"]})
            if not entry["passed"]:
                return make_finding(
                    "shapes",
                    f"invalid input {case} was not refused as expected by {path}: "
                    f"{entry.get('error') or 'an output'}: {entry.get('message')}",
                    what="input contract",
                    input=f"case {case}",
                    paths=[path],
                )
    return None
