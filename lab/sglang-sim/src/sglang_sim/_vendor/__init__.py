"""Third-party code shipped inside the simulator so it keeps no install-time dependencies.

``yaml``: PyYAML 6.0.4 (MIT, ``yaml/LICENSE``), its pure-Python package unchanged except that ``cyaml.py``
(the libyaml binding) is left out. sglang 0.5.9 reads ``--config`` with ``yaml.safe_load``, which always
uses PyYAML's pure-Python ``SafeLoader``, so this is the same code the real engine runs.
"""
