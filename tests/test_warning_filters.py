"""The suite's warning filters (pyproject.toml, [tool.pytest.ini_options] filterwarnings):
every warning is an error, except the few named there that come from outside our code.

These tests run under the project's pytest configuration: pytest applies those filters
around each test, so a warning issued here meets exactly the rules a warning from the code
under test meets.
"""

from __future__ import annotations

import warnings

import pytest

# The warning JAX's Cloud TPU start-up issues on `import jax` on a stock TPU v5e VM
# (jax/_src/cloud_tpu_init.py, a plain warnings.warn without stacklevel), which stopped
# tests/conftest.py there before any test ran (issue 44).
_HUGEPAGES = (
    "Transparent hugepages are not enabled. TPU runtime startup and shutdown time should be "
    "significantly improved on TPU v5e and newer."
)


def _warn_from(module: str, message: str) -> None:
    """Issue ``message`` as a UserWarning the way code in ``module`` does: warnings.warn
    takes the module a warning comes from from the calling frame's ``__name__``, which is
    what a filter's module field is matched against."""
    code = compile(f"import warnings\nwarnings.warn({message!r})\n", f"<{module}>", "exec")
    exec(code, {"__name__": module})


def test_the_tpu_start_up_warning_is_not_an_error() -> None:
    with warnings.catch_warnings(record=True) as shown:
        _warn_from("jax._src.cloud_tpu_init", _HUGEPAGES)
    assert shown == [], "the filter ignores it: it is neither raised nor shown"


@pytest.mark.parametrize(
    "module",
    [
        "vmapcheck.check.checks",  # our own code: must stay warning-free
        "jax",  # jax/__init__.py's "cloud_tpu_init failed": a JAX bug, not the VM's settings
        "jax._src.cloud_tpu_init_extra",  # the filter names the one module, not a prefix
        "tests.test_warning_filters",
    ],
)
def test_any_other_user_warning_is_still_an_error(module: str) -> None:
    with pytest.raises(UserWarning, match="Transparent hugepages"):
        _warn_from(module, _HUGEPAGES)


def test_the_tpu_start_up_module_gets_no_pass_for_other_categories() -> None:
    """Only its UserWarnings are ignored: a DeprecationWarning from it is still an error."""
    with pytest.raises(DeprecationWarning, match="old"):
        warnings.warn_explicit(
            "old", DeprecationWarning, "cloud_tpu_init.py", 1, module="jax._src.cloud_tpu_init"
        )
