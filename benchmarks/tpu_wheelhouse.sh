#!/usr/bin/env bash
# The wheels a TPU machine of this workplace lacks, for benchmarks/tpu_run.sh's install
# step (docs/accelerators.md): Python 3.11, x86-64, glibc 2.36, no network there. Fills
# .whl-tpu/ (git ignores it: add `/.whl-tpu/` to .git/info/exclude), 52 wheels, 43 MiB.
# The list was resolved on 2026-12-06 against the machine's own index
# (file:///opt/pypi/simple: what it holds is left out) for vmapcheck[flax] at the ranges
# of pyproject.toml; a name here is one the index lacks or holds too old. Change the list
# when pyproject.toml's ranges change.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${WHEELHOUSE:-.whl-tpu}
mkdir -p "$DEST"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
WHEELS=(
    aiohttp-retry==2.9.1
    asyncssh==2.24.1
    atpublic==9.0.0
    certifi==2026.10.19.post1
    click-didyoumean==0.3.1
    click-repl==0.4.1
    configobj==5.0.9
    databricks-sdk==0.162.0
    dictdiffer==0.10.0
    dm-haiku==0.0.17
    dpath==2.2.0
    dulwich==1.2.21
    dvc==3.67.1
    dvc-data==3.18.3
    dvc-http==2.32.0
    dvc-objects==5.2.0
    dvc-render==1.0.2
    dvc-studio-client==0.23.0
    dvc-task==0.40.2
    entrypoints==0.4.2
    equinox==0.13.8
    flatten-dict==0.5.0
    flufl-lock==9.2.0
    funcy==2.1
    grandalf==0.8
    graphene==3.4.3
    graphql-relay==3.2.0
    gto==1.10.1
    huey==3.5.4
    hydra-core==1.3.8
    iterative-telemetry==0.0.10
    jmp==0.0.4
    mlflow==3.17.2
    mlflow-skinny==3.17.2
    mlflow-tracing==3.17.2
    opentelemetry-semantic-conventions==0.66b0
    packaging==26.4
    pandas==3.1.1
    pydantic==2.14.4
    pydantic-core==2.50.5
    pygit2==1.21.0
    pygtrie==2.6.2
    pyyaml==6.0.4
    scmrepo==3.6.2
    semver==3.1.2
    shortuuid==1.0.13
    shtab==1.13.0
    skops==0.16.0
    sqltrie==0.11.3
    voluptuous==0.16.0
    zc-lockfile==4.0
)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
# hydra-core's antlr4 runtime is an sdist on PyPI: built here (pure Python).
python3 -m pip wheel --quiet --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
du -sh "$DEST"
