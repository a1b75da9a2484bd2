from setuptools import find_packages, setup

# The tests run real DDP jobs: torch 2.13.0 is pinned so a fresh CI machine takes the CPU wheel on disk
# instead of the newest CUDA build (several GB). numpy: without it every torch rank warns "Failed to initialize
# NumPy" twice (issue 13).
# setuptools and wheel: tests/test_packaging.py builds the wheel from the tree, as `pip install .` does.
# playwright: the tests that open report.html in Chromium (the system browser: no `playwright install`; issue 40 §2).
METRICS = ["prometheus_client>=0.17"]  # --metrics_port (issue 40): imported only when the flag is given
TEST = METRICS + ["pytest>=7", "setuptools>=61", "wheel", "numpy>=1.24", "hypothesis>=6", "paramiko>=3", "rich>=13", "torch==2.13.0", "mpi4py>=4", "mypy>=1.10", "ruff>=0.5", "playwright>=1.40"]

setup(
    name="xrun",
    version="0.1.0",
    description="A lean multi-node launcher for PyTorch training",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # The src layout: from the repository root nothing named xrun is importable, so tests and ranks import the
    # installed package, the one users get (issue 37: a file the wheel left out broke every install unnoticed).
    package_dir={"": "src"},
    packages=find_packages("src", include=["xrun", "xrun.*"]),
    # report.html's charting library, vendored with its licence (docs/report.md)
    package_data={"xrun.runner.report": ["vendor/plotly-basic.min.js", "vendor/LICENSE.plotly.js"]},
    # py-spy: the hang doctor's stacks (issue 14); cryptography: the control channel's per-run TLS certificate
    # (issue 22; paramiko needed it already, wheels for every platform)
    install_requires=["psutil>=5.9", "py-spy>=0.3.14", "cryptography>=3.4"],
    extras_require={
        "ssh": ["paramiko>=3"],
        "mpi": ["mpi4py>=4"],
        "elastic": ["torch>=2.1", "numpy>=1.24"],
        "status": ["rich>=13"],
        # NVML's reading of who holds GPU memory after an attempt (xrun.launch.ranks.gpu_release); without it
        # xrun asks nvidia-smi
        "gpu": ["nvidia-ml-py>=12"],
        "test": TEST,
        "clients": ["accelerate>=0.30", "transformers>=4.40", "lightning>=2.2"],  # the clients test tier (issue 13)
        "metrics": METRICS,
        "bench": ["matplotlib>=3.7", "pyinstrument>=4.6"],
        "all": ["paramiko>=3", "mpi4py>=4", "rich>=13", "nvidia-ml-py>=12"] + [t for t in TEST if not t.startswith(("paramiko", "rich", "mpi4py"))],
    },
    entry_points={"console_scripts": ["xrun=xrun.__main__:main"]},
)
