"""The dashboard page served by ``rp.Server(dashboard_address=...)``: static files, no build step."""
