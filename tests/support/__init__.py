"""What tests share, imported as `support.<module>` (tests/ is on sys.path: pytest puts the
rootdir conftest's folder there), never through another test module:

- `support.runs`: the one set of tiny settings (`TINY` and the variants derived from it), a
  small `data/` written directly, and train-gpt run on it.
- `support.models`: a run's model as train-gpt leaves it, and generative-prompt run on it.
- `support.web`: a local HTTP server of corpus texts (conftest.py's `web_server` fixture).
- `support.trainjobs`: train-gpt and stand-in programs as TrainJobs on the test cluster.
- `support.tree`: a copy of the project to make edits in, and the files they changed.
- `support.once`: what tests on different pytest-xdist workers compare against, made once.
- `support.apiserver`: the test Kubernetes API server (etcd and apiextensions-apiserver of
  ../shared/k8s-apiserver), one a session (conftest.py's `apiserver` fixture).
- `support.cluster`: the test cluster on that server, Kubeflow Trainer v2.3, JobSet and a
  kubelet played with local processes (conftest.py's `trainer_cluster` fixture).

Fixtures live in tests/conftest.py, which imports them from here.
"""
