from common.processes import exit_with_parent

exit_with_parent()  # first: a parent that died meanwhile ends us before we bind a port

from gateway.cli.main import cli  # noqa: E402

cli()
