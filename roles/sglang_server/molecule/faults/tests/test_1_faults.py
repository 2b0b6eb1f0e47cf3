"""Every fault kind: the host fails clearly, the previous version serves again, the report records the rollback."""

from fault_common import (  # noqa: F401  (fixtures and tests)
    bad_deploy,
    test_host_failed_with_a_clear_message,
    test_previous_version_serves_and_is_healthy,
    test_report_records_the_rollback,
)
