"""The ``fleet-test`` kernel that tests share (kernelspec ``fleet-test-shared``): the product's kernel, plus a
comm target that puts back the kernel-wide state a test may change, so the next test meets it as a fresh one.

Started as a script by its kernelspec (``tests/kernel/conftest.py`` writes it): nothing here is in the product.
"""

from __future__ import annotations

from typing import Any

from ipykernel.kernelapp import IPKernelApp

from fleet_kernel.kernel.kernel import FleetKernel

RESET_TARGET = "fleet-test.reset"


class SharedTestKernel(FleetKernel):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.comm_manager.register_target(RESET_TARGET, self._reset)

    def _reset(self, _comm: Any, _msg: dict[str, Any]) -> None:
        """What ``%fleet`` commands and frontends change for the whole kernel, as a new kernel has it: settings
        (``%fleet model``, ``%fleet sandbox``) read again from the environment, no parameters (``%fleet set``),
        no preselected skills, no chosen output, no session, no widget manager or terminal seen,
        no cell run yet."""
        ctx = self.ctx
        ctx.params = {}
        ctx.skills = ()
        ctx.explicit_output = None
        ctx.widgets_seen = False
        ctx.console_seen = False
        ctx.progress = None
        ctx.session_id = None  # the next turn starts a session, as a new kernel's first turn does
        if ctx._settings is not None:
            ctx._settings = None
            if ctx.runner is not None:
                ctx.runner.settings = ctx.settings
        self._executed = False


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=SharedTestKernel, capture_fd_output=False, log_level="ERROR")
