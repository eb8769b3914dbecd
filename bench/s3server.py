"""A real S3 server on this machine: moto's standalone server (what s3fs's own tests run against)
on a free loopback port, for tests/workload/fetch/test_objectstore.py and bench/corpus_speed.py.

It enforces authentication and IAM policies (moto's INITIAL_NO_AUTH_ACTION_COUNT): the first
requests create an IAM user with S3 rights and its access key, and one with a key but no rights;
then a request signed with other keys is refused (InvalidAccessKeyId), and one of the user
without rights is denied (AccessDenied), as AWS and MinIO refuse them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

BUCKET = "gpt-corpora"
# The requests that run before authentication is on: create_user, put_user_policy and
# create_access_key for the user with rights, create_user and create_access_key for the one
# without (moto counts each action it serves; its /moto-api/ health page is none).
_SETUP_ACTIONS = 5
_POLICY = {"Version": "2012-10-17",
           "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}  # fmt: skip
# Variables of this machine's environment that would change where or as whom a client connects.
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
                 "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """`with S3Server() as s3:` a running server with bucket BUCKET; `s3.env()` the variables a
    client needs (the keys, the endpoint), `s3.client()` a boto3 client with them."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.key_id = self.secret = ""
        self.rightless: tuple[str, str] = ("", "")

    def __enter__(self) -> S3Server:
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_ACTIONS)}
        for name in AWS_VARIABLES:
            env.pop(name, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on {self.url}") from None
                time.sleep(0.1)
        iam = self._boto("iam", "setup", "setup")
        iam.create_user(UserName="gpt")
        iam.put_user_policy(UserName="gpt", PolicyName="s3", PolicyDocument=json.dumps(_POLICY))
        key = iam.create_access_key(UserName="gpt")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        iam.create_user(UserName="nobody")
        key = iam.create_access_key(UserName="nobody")["AccessKey"]
        self.rightless = (key["AccessKeyId"], key["SecretAccessKey"])
        self.client().create_bucket(Bucket=BUCKET)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.url, "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip

    def client(self) -> Any:
        return self._boto("s3", self.key_id, self.secret)

    def _boto(self, service: str, key_id: str, secret: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=key_id, aws_secret_access_key=secret)  # fmt: skip
