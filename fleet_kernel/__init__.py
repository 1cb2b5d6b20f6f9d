"""Fleet: recursive language models (dspy.RLM) as a Jupyter kernel, with a durable store and an HTTP sidecar."""

__version__ = "0.1.0"

import os as _os

# Offline by default: LiteLLM must use its bundled model cost map instead of fetching one at import.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext fleet_kernel``: the ``%%fleet`` and ``%fleet`` magics.

    Imported only now, so importing this package stays light.
    """
    from fleet_kernel.magic import load  # IPython's magics load only in a notebook that asks

    load(ipython)
