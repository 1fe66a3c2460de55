from setuptools import find_packages, setup

setup(
    name="ssm_fairseq",
    version="0.1.0",
    description="State space models (S4, S4D, DSS, MSSM, Stateformer, SPADE) as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ssm_fairseq", "ssm_fairseq.*"]),
    python_requires=">=3.8",
    install_requires=[
        "torch>=2.6",  # torch.load with weights_only=True by default: a checkpoint cannot run code
        "torchaudio>=2.0",
        "numpy<2",  # fairseq 0.12 uses np.compat, removed in numpy 2
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "fairseq==0.12.2; python_version < '3.11'",
        "sentencepiece",
        "soundfile",
        "editdistance",
    ],
    extras_require={"plots": ["matplotlib"], "test": ["pytest"]},
)
