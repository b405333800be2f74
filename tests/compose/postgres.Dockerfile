# A stand-in for the official postgres:15 image, from Debian's postgresql-15 package, for
# tests/image.sh to run docker/compose.yaml without a registry. It honours what the demo uses
# of the official image (postgres-entrypoint.sh says what), nothing more.
FROM debian:bookworm-slim
# No cluster made at install: the entrypoint makes one in PGDATA on first start.
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["postgres"]
