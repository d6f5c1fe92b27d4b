"""The surface-neutral web server: document viewer, original files, health checks."""
