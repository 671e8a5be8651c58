"""Secrets of every shape the redaction knows, and what must not be left of each."""

from __future__ import annotations

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
# name: (text holding the secret, what must not be left of it after redaction)
SECRETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gateway key": ("sk-acme-demo-1234567890", ("1234567890",)),
    "project key": ("sk-proj-AbCdEf0123456789", ("AbCdEf0123456789",)),
    "bearer token": (f"Bearer {JWT}", ("eyJhbGciOiJIUzI1NiJ9", "c2lnbmF0dXJl")),
    "bare jwt": (f"id_token {JWT}", ("eyJhbGciOiJIUzI1NiJ9", "eyJzdWIiOiIxIn0")),
    "aws key id": ("AKIAIOSFODNN7EXAMPLE", ("IOSFODNN7EXAMPLE",)),
    "aws secret": (
        "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ("wJalrXUtnFEMI",),
    ),
    "aws secret in json": (
        '{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG bPxRfiCYEXAMPLEKEY"}',
        ("wJalrXUtnFEMI", "bPxRfiCY"),
    ),
    "aws session token": ("aws_session_token=FwoGZXIvYXdzEJr1234", ("FwoGZXIvYXdzEJr",)),
    "github token": ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", ("16C7e42F292c6912",)),
    "slack token": ("xoxb-123456789012-abcdefghijKLMN", ("abcdefghijKLMN",)),
    "hugging face token": ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", ("AbCdEfGhIjKlMnOp",)),
    "google api key": ("AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", ("SyDaGmWKa4JsXZ",)),
    "google oauth token": ("ya29.a0AfH6SMBx3kq-ZyXwVuTsRqPoN", ("a0AfH6SMBx3kq",)),
    "private key": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        ("MIIEowIBAAKCAQEA",),
    ),
    "private key cut off": (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAAC3Nz",
        ("b3BlbnNzaC1rZXktdjEAAAAA", "AAAAC3Nz"),
    ),
    "url password": ("redis://default:hunter2-secret@10.0.0.7:6379/0", ("hunter2-secret",)),
    "url password, empty user": ("redis://:hunter2@10.0.0.8:6379", ("hunter2",)),
    "url password with / and @": (
        "postgres://app:pa/ss@w0rd@db.internal:5432/app",
        ("pa/ss", "w0rd"),
    ),
    "url password, e-mail user": (
        "postgres://jane@corp.example:pw-s3cret@10.0.0.9/app",
        ("pw-s3cret", "jane"),
    ),
    "password field": ("password=correct-horse-battery", ("correct-horse-battery",)),
    "password in a dict repr": ("{'password': 'horse battery, staple'}", ("horse", "staple")),
    "password in escaped json": ('{\\"password\\": \\"s3cr3t-pw\\"}', ("s3cr3t-pw",)),
    "client secret": ("client_secret=Zx8~vQ.cl13nt", ("Zx8~vQ.cl13nt",)),
    "access token": ("?access_token=at-998877&model=m", ("998877",)),
    "azure client secret": ("AZURE_CLIENT_SECRET=azS3cr~et.value", ("azS3cr~et",)),
    "azure account key": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6+/==;"
        "EndpointSuffix=core.windows.net",
        ("Zm9vYmFyYmF6",),
    ),
    "azure sas signature": (
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=AbC%2BdEf%3D&se=1",
        ("AbC%2BdEf",),
    ),
    "x-api-key header": ("x-api-key: k3y-abc123def456", ("abc123def456",)),
    "e-mail": ("jane.doe@example.com", ("jane.doe",)),
    # The gaps a review found with log_prompts on (issue 12).
    "bare aws secret": (
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ("wJalrXUtnFEMI", "EXAMPLEKEY"),
    ),
    "pwd: value": ("pwd: Tr0ub4dor&3", ("Tr0ub4dor",)),
    "pw=value": ("db_pw=letmein-42", ("letmein-42",)),
    "passphrase=value": ("passphrase=open sesame", ("open",)),
    "stripe live key": ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", ("4eC39HqLyjWDarjtT1zdp7dc",)),
}
ALL_SECRETS = " ".join(text for text, _ in SECRETS.values())
ALL_LEFTOVERS = [leftover for _, leftovers in SECRETS.values() for leftover in leftovers]


def leftovers_in(text: str) -> list[str]:
    return [leftover for leftover in ALL_LEFTOVERS if leftover in text]
