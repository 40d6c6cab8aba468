"""Container images built here, without a registry: a Debian base with Node.js and the harness CLIs, and task
images built `FROM` it.

`rootfs` makes the Debian layer (debootstrap, `docker import`), `base` adds Node.js and the npm CLIs and tags
the result by a hash of what went in, `task` builds a task's Dockerfile on top of a base, and `daemon` is the
Docker API they share (a Docker daemon, or podman's Docker-compatible service).
"""
