from ipykernel.kernelapp import IPKernelApp

from fleet_kernel.kernel.kernel import FleetKernel

IPKernelApp.launch_instance(kernel_class=FleetKernel, capture_fd_output=False, log_level="ERROR")
