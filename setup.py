"""DataBloom: RL training as an orchestrated batch workflow (ActorQ + SEED RL + zarr)."""
from setuptools import find_packages, setup

# Optional parts, one list each, reused by the `test` extra.
# mujoco 4.0.0 breaks dm-control 1.0.50 (MjModel.flex_vertedge); dm-control 1.0.52 needs mujoco >= 4.0.1, so it is
# bounded too: left open, a fresh install fetched 1.0.52 and backtracked (.ci/run warned, 2026-12-08).
DMC = ["dm-control>=1.0.50,<1.0.52", "mujoco>=3.17,<4"]
ATARI = ["ale-py>=0.12"]                           # the ROMs ship inside the wheel
XARRAY = ["xarray"]
DATAFLOW = ["apache-beam[gcp]>=2.77"]              # DataflowRunner job requests (tests translate with --dry_run)
RLDS = ["tensorflow-datasets>=4.9.10"]             # RLDS export through TFDS's own writer
# ActorQ's carbon tracker (core.carbon.eit_compat adapts its imports). It imports pkg_resources, which
# setuptools 81 removed, and Python 3.12 venvs ship no setuptools at all.
EIT = ["experiment-impact-tracker==0.1.8", "setuptools<81"]
# s3:// run directories. aiobotocore pins botocore to a window of a few releases and every boto3
# release pins one botocore, so boto3 (which moto needs) is bounded to that same window; without it
# pip backtracks through boto3 releases for minutes.
S3 = ["s3fs>=2024.10", "aiobotocore>=3.10,<3.11", "boto3>=1.43.115,<1.43.118"]

setup(
    name="databloom",
    version="0.1.0",
    description=(
        "Reinforcement learning as a batch workflow: int8 actors fanned out on "
        "Dask or Beam, zarr replay shards with an atomic commit log, and async "
        "parallel zarr checkpoints."
    ),
    # Verified in brand-new venvs with both README commands (README "Tests and CI"): 3.11 and 3.12.
    # On 3.13 the core installs and trains, but the test/dmc extras do not install: dm-control needs
    # labmaze, which has no 3.13 wheel and builds only with bazel. Lift the cap when labmaze ships one.
    python_requires=">=3.11,<3.13",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["core", "core.*", "pipelines", "pipelines.*"]),
    package_data={"": ["*.yaml"]},
    install_requires=[
        # Versions follow shared/PLATFORM_FACTS.md: this set resolves in one pip call.
        "tensorflow-cpu>=2.21,<2.22",
        "tensorboard>=2.21,<2.22",  # tf.summary needs it; TF 2.21 no longer pulls it in
        "ai-edge-litert>=2.3,<3",
        "apache-beam>=2.77",
        "dask>=2026.8.0",
        "distributed>=2026.8.0",
        "zarr>=3.1.6,<4",
        "numcodecs>=0.16",
        "crc32c>=2.4",
        "tensorstore>=0.1.86",
        "fsspec",
        "numpy>=2.0,<2.5",
        "gymnasium>=1.4,<2",
        "pyyaml>=6",
        "tqdm>=4.66",
        "matplotlib",
        "psutil",                   # process CPU time for energy attribution and time-to-target clocks
        "codecarbon>=3.3",          # default energy/CO2e backend, offline mode (core.carbon)
        "grpcio>=1.60",             # SEED central inference: bidi streaming, raw numpy bytes (core.inference)
    ],
    extras_require={
        # Everything the test suite exercises, so a fresh machine runs all of it and CI skips nothing.
        # Each bound states a real need; see the comments. (The old open-ended `boto3>=1.35` made pip
        # walk back through hundreds of boto3 releases and end in ResolutionImpossible.)
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist>=3.8",     # 2 workers (pytest.ini), ~1.6x faster on 2 cores; 3.8: --no-loadscope-reorder
            *DMC, *ATARI, *XARRAY, *DATAFLOW, *RLDS, *EIT,
            "moto[server]>=5.2.1",   # its S3 server answers PUT If-None-Match: * with 412 from 5.0.15 on
            *S3,
        ],
        "atari": ATARI,
        "dmc": DMC,
        "dataflow": DATAFLOW,
        "s3": S3,
        "gcs": ["gcsfs"],           # gs:// run directories (core.urls); gcsfs pins the matching fsspec
        "rlds": RLDS,
        "eit": EIT,
        "carbon": ["codecarbon>=3.3"],
        "xarray": XARRAY,
        "bench": ["stable-baselines3>=2.3", "torch==2.13.0"],
    },
    entry_points={"console_scripts": ["databloom-train=pipelines.train:main"]},
)
