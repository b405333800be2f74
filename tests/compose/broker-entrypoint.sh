#!/bin/bash
# Runs tansu (in-memory storage) as the compose file's kafka service: it listens on port 9092
# and advertises the PLAINTEXT address of KAFKA_ADVERTISED_LISTENERS (kafka:9092 there).
# The topics in BROKER_TOPICS (name:partitions, space separated) are created up front (the
# compose file lets Kafka create them on first use: KAFKA_AUTO_CREATE_TOPICS_ENABLE) once it
# listens; the container is healthy after that.
set -euo pipefail
advertised=${KAFKA_ADVERTISED_LISTENERS:-PLAINTEXT://localhost:9092}
advertised=${advertised#*PLAINTEXT://}
advertised=${advertised%%,*}
tansu broker --storage-engine memory://tansu/ --listener-url tcp://0.0.0.0:9092 \
  --advertised-listener-url "tcp://$advertised" &
broker=$!
trap 'kill -TERM "$broker"' TERM INT
for topic in ${BROKER_TOPICS:-}; do
  for _ in $(seq 60); do
    tansu topic create "${topic%%:*}" --partitions "${topic##*:}" --broker tcp://127.0.0.1:9092 \
      >/dev/null 2>&1 && break
    sleep 0.5
  done
  tansu topic list --broker tcp://127.0.0.1:9092 2>/dev/null | grep -q "${topic%%:*}" \
    || { echo "broker-entrypoint: could not create topic $topic" >&2; kill "$broker"; exit 1; }
done
touch /tmp/broker-ready  # the health check's sign that the topics exist
wait "$broker"
