from gateway.cli.main import cli

cli()
