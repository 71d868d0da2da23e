"""The MPI world a GPU stage runs in: this process's rank, the number of processes, one build shared by all ranks.

Under `mpirun -n N`, every rank runs the same script. The rank and size come from TensorRT-LLM's own helpers
(`tensorrt_llm.mpi_rank()`, `mpi_world_size()`, `mpi_comm()`: mpi4py's COMM_WORLD), so they are the numbers its
runtime checks against: `ModelRunnerCpp.from_dir` asserts `rank == world_config.rank`, and the C++ WorldConfig stops
with "MPI size … != TP size … * PP size … * CP Size …" when the world is not tp × pp processes (NVIDIA/TensorRT-LLM #1992).
"""

import importlib.util
import os
from dataclasses import dataclass

from .gpu import GPUStackError

# how MPI launchers tell a process the size of its world: Open MPI (mpirun), MPICH and Intel MPI (Hydra), Slurm's PMI
LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# the prefixes of every variable those launchers give a rank (Open MPI 5 / PRRTE / PMIx, Hydra / PMI)
LAUNCHER_VAR_PREFIXES = ("OMPI_", "PRTE_", "PMIX_", "PMI_", "HYDRA_")
# the user's own Open MPI settings under those prefixes, which a child that starts MPI alone needs too: leave to run
# as root (mpirun's --allow-run-as-root reaches only mpirun's own processes), and the launcher choice, as in
# OMPI_MCA_plm=^rsh where no ssh or rsh is installed (Open MPI 4's rsh launcher fails early there otherwise, even on
# one machine: open-mpi/ompi#12386)
USER_MPI_VARS = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "OMPI_MCA_plm")


class WorldSizeError(RuntimeError):
    """The MPI world does not have the tp × pp processes the engine was built for."""


class BuildFailedError(RuntimeError):
    """The build that rank 0 ran for every rank failed; every rank stops with its message."""


@dataclass(frozen=True)
class MpiWorld:
    """This process's place in the MPI world: rank, size, and the communicator (None for a single process)."""

    rank: int
    size: int
    comm: object = None  # mpi4py's Intracomm (TensorRT-LLM's mpi_comm()), used only when size > 1

    def broadcast(self, value):
        """Rank 0's `value` on every rank (MPI_Bcast through mpi4py's pickling bcast)."""
        return value if self.size == 1 else self.comm.bcast(value, root=0)


def launcher_world_size() -> int:
    """How many processes the MPI launcher started (1 when this process was not started by one)."""
    for name in LAUNCHER_SIZE_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def launcher_free_env(env=None) -> dict:
    """`env` (default os.environ) without the MPI launcher's variables, for a child process that starts MPI itself.

    A rank's child that initializes MPI with its parent's launcher variables tries to join the parent's job as that
    rank and hangs or fails (measured with Open MPI 5.0 here: docs/tensorrt.md); without them it is an MPI world of
    its own, as when `trtllm-build` runs in a shell. USER_MPI_VARS stay.
    """
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k in USER_MPI_VARS or not k.startswith(LAUNCHER_VAR_PREFIXES)}


def mpi_world() -> MpiWorld:
    """This process's MPI world, read with TensorRT-LLM's helpers when it is installed, else a single process.

    Without tensorrt_llm a process started by an MPI launcher still learns the world's size (LAUNCHER_SIZE_VARS), so
    a world of several processes without tensorrt_llm is refused rather than run N times over the same files.
    """
    if importlib.util.find_spec("tensorrt_llm") is not None:
        import tensorrt_llm  # noqa: PLC0415 — optional: GPU machines

        return MpiWorld(tensorrt_llm.mpi_rank(), tensorrt_llm.mpi_world_size(), tensorrt_llm.mpi_comm())
    size = launcher_world_size()
    if size > 1:
        raise WorldSizeError(
            f"this process was started as one of {size} MPI processes, but tensorrt_llm (whose MPI helpers give each "
            "process its rank) is not installed here: run the GPU stage under mpirun in the TensorRT-LLM "
            "environment (docs/tensorrt.md), and the prepare stage once, without mpirun"
        )
    return MpiWorld(0, 1)


def check_world(world: MpiWorld, tp_size: int, pp_size: int = 1, what: str = "the engine") -> None:
    """Refuse a world that is not tp × pp processes, saying how to launch it (before TensorRT-LLM asserts it)."""
    needed = tp_size * pp_size
    if world.size == needed:
        return
    launch = "run it in one process, without mpirun" if needed == 1 else f"launch it with mpirun -n {needed}"
    raise WorldSizeError(
        f"{what} is split for tp_size {tp_size} × pp_size {pp_size} = {needed} process(es), but this MPI world has "
        f"{world.size}: {launch}, or convert and build again with --tp-size {world.size}. (TensorRT-LLM itself would "
        f"stop with 'MPI size {world.size} != TP size {tp_size} * PP size {pp_size} * CP Size 1'; NVIDIA/TensorRT-LLM "
        "#1992)"
    )


def build_once(world: MpiWorld, build, log=print):
    """Run `build()` on rank 0 only and hand its result to every rank; the others wait in the broadcast.

    When the build fails on rank 0, rank 0 raises its error and every other rank raises one with the same message
    (a GPUStackError stays a GPUStackError): no rank waits forever for a build that will not come.
    """
    if world.size == 1:
        return build()
    if world.rank == 0:
        try:
            value = build()
        except Exception as err:
            world.broadcast(("failed", type(err).__name__, str(err)))
            raise
        return world.broadcast(("done", None, value))[2]
    log(f"[rank {world.rank}] waiting for rank 0 to build")
    status, kind, value = world.broadcast(None)
    if status == "failed":
        error = GPUStackError if kind == GPUStackError.__name__ else BuildFailedError
        raise error(f"rank 0 could not build ({kind}): {value}")
    return value
