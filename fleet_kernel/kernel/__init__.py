"""The ``fleet`` Jupyter kernel: ``FleetKernel`` in ``kernel.py``, launched by ``python -m fleet_kernel``."""
