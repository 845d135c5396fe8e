"""How the test command shares its work between the cores (pytest-xdist, `--dist loadfile`).

Each file is one unit of work, so a notebook runs top to bottom in one kernel and a module's fixtures
are built once. Notebooks 11, 12 and 13 are one unit, in that order: 11 trains `runs/course_model`,
which 12 and 13 load (a second process would train it again into the same folder). The off-repo
test's solutions are a unit of their own, beside its notebooks. The two longest units are handed
out first, so no core is left with one of them at the end.

nbval's kernels talk over local sockets in a folder of each process's own, not over TCP: jupyter_client
picks a kernel's TCP ports by binding and releasing free ones, and with many workers another worker's
kernel can take a port in between; the kernel then dies before it answers ("Kernel died before
replying to kernel_info": 2 of the 29 notebooks and solutions on a 16-core GPU machine, 2026-11-27).
"""
import os
import shutil
import tempfile

import pytest

COURSE_MODEL = "course_model"
# The notebooks that share runs/course_model, in the order they must run.
COURSE_MODEL_NOTEBOOKS = ("notebooks/11_training.ipynb", "notebooks/12_decoding.ipynb",
                          "notebooks/13_evaluation.ipynb")
# A test that is a unit by itself: it takes minutes, and shares with its file only a fixture that
# is cheap to build twice.
OWN_UNIT = ("tests/test_off_repo.py::test_every_notebook_runs_in_an_empty_folder[solutions]",)
# The two units that take longest, handed out first, one to each worker: the off-repo test installs
# a venv and runs every notebook; the course model's unit trains it. Everything else follows in
# collection order, so the unit a worker is sent beside its first (xdist sends the next unit when
# at most 2 tests are left) is a short one, and the off-repo solutions come in their file's place.
SLOW_FIRST = ("tests/test_off_repo.py", COURSE_MODEL)


def work_unit(nodeid: str) -> str:
    """The unit of work an item belongs to: its file, `course_model` for notebooks 11-13, or itself."""
    path = nodeid.split("::", 1)[0]
    if nodeid in OWN_UNIT:
        return nodeid
    return COURSE_MODEL if path in COURSE_MODEL_NOTEBOOKS else path


def pytest_collection_modifyitems(config, items):
    """Slow units first, each unit's items together and in their own order (a stable sort)."""
    def rank(item):
        unit = work_unit(item.nodeid)
        return SLOW_FIRST.index(unit) if unit in SLOW_FIRST else len(SLOW_FIRST)
    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with notebooks 11-13 as one unit and the units in collection order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebookFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False   # xdist would hand out the units with most items first
    return NotebookFileScheduling(config, log)


def pytest_configure(config):
    """Every kernel nbval starts in this process uses IPC sockets in a private folder (see above)."""
    if os.name == "nt" or not config.pluginmanager.hasplugin("nbval"):
        return                                     # Windows has no IPC transport: TCP as before
    import nbval.kernel

    socket_dir = tempfile.mkdtemp(prefix="nbk-")   # short: a socket's path must stay under 104 bytes
    config.add_cleanup(lambda: shutil.rmtree(socket_dir, ignore_errors=True))

    class LocalSocketKernelManager(nbval.kernel.KernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.transport, self.ip = "ipc", os.path.join(socket_dir, "kernel")

    nbval.kernel.KernelManager = LocalSocketKernelManager
