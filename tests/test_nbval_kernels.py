"""nbval's kernels in the test command talk over local sockets, not TCP ports (tests/conftest.py says why)."""
import os

import pytest

nbval_kernel = pytest.importorskip("nbval.kernel")


@pytest.mark.skipif(os.name == "nt", reason="Windows has no IPC transport; its kernels use TCP")
def test_nbval_kernel_answers_over_a_local_socket():
    km, kc = nbval_kernel.start_new_kernel(kernel_name=nbval_kernel.CURRENT_ENV_KERNEL_NAME)
    try:
        assert (km.transport, os.path.isabs(km.ip)) == ("ipc", True), (km.transport, km.ip)
        assert os.path.exists(f"{km.ip}-{km.shell_port}"), "the shell socket lives in the private folder"
        reply = kc.execute_interactive("print(6 * 7)", timeout=60, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
