"""The settings of the demo panels the tests start (tests/integration/demo.py): the panel's
own, with the tests' fast password hasher (tests/conftest.py does the same in process). The
demo logins are hashed on every `serve --demo` and checked on every sign-in: 0.23 s of CPU
each with Django's default PBKDF2, a few seconds a browser test."""

from controlpanel.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
