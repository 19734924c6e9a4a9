"""Entry points: the CLI, the Prometheus exporter, the classroom page, the HTML report."""
