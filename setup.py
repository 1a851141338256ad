"""DataBloom: RL training as an orchestrated batch workflow (ActorQ + SEED RL + zarr)."""
from setuptools import find_packages, setup

setup(
    name="databloom",
    version="0.1.0",
    description=(
        "Reinforcement learning as a batch workflow: int8 actors fanned out on "
        "Dask or Beam, zarr replay shards with an atomic commit log, and async "
        "parallel zarr checkpoints."
    ),
    python_requires=">=3.11",
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
        # Everything the test suite exercises, so a fresh machine runs all of it: dm_control tests
        # (~10 s install), the Atari adapter (ROMs ship in the ale-py wheel), xarray snapshot views.
        # moto's S3 server answers a PUT with If-None-Match: * by 412 from 5.0.15 on (tested 5.2.1, 5.2.5).
        "test": ["pytest>=8", "pytest-timeout", "dm-control>=1.0.50", "mujoco>=3.17,<4", "ale-py>=0.12",
                 "xarray", "moto[server]>=5.2.1", "s3fs>=2024.10", "boto3>=1.35"],
        "atari": ["ale-py>=0.12"],
        "dmc": ["dm-control>=1.0.50", "mujoco>=3.17,<4"],
        "dataflow": ["apache-beam[gcp]>=2.77"],
        "carbon": ["codecarbon>=3.3"],
        "xarray": ["xarray"],
        "bench": ["stable-baselines3>=2.3", "torch==2.13.0"],
    },
    entry_points={"console_scripts": ["databloom-train=pipelines.train:main"]},
)
