# A stand-in for the apache/kafka image: the tansu Kafka-protocol broker (the binary
# tests/setup-deps.sh builds, copied into the build context), for tests/image.sh to run
# docker/compose.yaml without a registry. broker-entrypoint.sh says what it honours.
FROM debian:bookworm-slim
COPY tansu /usr/local/bin/tansu
COPY broker-entrypoint.sh /usr/local/bin/broker-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/broker-entrypoint.sh"]
EXPOSE 9092
