"""Test reports as JSON, for the ranks' exchange and for the dispatcher."""

__all__ = ["from_json", "to_json"]


def to_json(config, report):
    return config.hook.pytest_report_to_serializable(config=config, report=report)


def from_json(config, data):
    report = config.hook.pytest_report_from_serializable(config=config, data=data)
    # A skip's (path, line, reason) comes back from JSON as a list; pytest's
    # summary of skips wants the tuple it was.
    if isinstance(report.longrepr, list):
        report.longrepr = tuple(report.longrepr)
    return report
