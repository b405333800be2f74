//! How the Kafka sink classifies the errors librdkafka gives for a record or a client call:
//! which a retry may fix, which are a size limit, which refuse the relay itself.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The record exceeds a size limit of the producer, broker or topic.
pub(super) fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    )
}

/// The broker refused the client: an authorization failure, which only the operator can mend
/// (ACLs). Shared by the checkpoint read and the transaction calls of exactly-once mode, which
/// stop the pipeline on it rather than retry.
///
/// Authentication is not among them. librdkafka turns the broker's SASL refusal (error 58,
/// kept here in case one gets through) into its local `Authentication` (-169), which also
/// stands for a SASL handshake cut by a broker restart, an OAUTHBEARER token refresh that failed
/// for now (librdkafka keeps the old token and tries again) and an unreachable Kerberos KDC,
/// and librdkafka itself keeps reconnecting after it. So wrong credentials, too, end the session
/// and are retried with the supervisor's backoff, the error on `/readyz`, like any broker
/// failure.
pub(crate) fn is_refused(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed
    )
}

/// Errors that publishing the same record again cannot fix.
pub(super) fn is_retryable(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    !matches!(
        error.rdkafka_error_code(),
        Some(
            MessageSizeTooLarge
                | InvalidMessageSize
                | InvalidMessage
                | InvalidTopic
                | UnknownTopic
                | TopicAuthorizationFailed
                | ClusterAuthorizationFailed
                | InvalidRecord
                | InvalidArgument
                | InvalidTimestamp
                | PolicyViolation
                // A partition placement beyond the topic's partitions.
                | UnknownPartition
                // A record larger than the broker's batch limit on its own.
                | MessageBatchTooLarge
                // Headers on a topic whose message format predates them.
                | UnsupportedForMessageFormat
                | InvalidRequiredAcks
                | TransactionalIdAuthorizationFailed
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_that_publishing_again_cannot_fix_are_not_retried() {
        use RDKafkaErrorCode::*;
        let delivery = |code| KafkaError::MessageProduction(code);
        for permanent in [
            MessageSizeTooLarge,
            MessageBatchTooLarge,
            UnsupportedForMessageFormat,
            InvalidRequiredAcks,
            TopicAuthorizationFailed,
            TransactionalIdAuthorizationFailed,
            PolicyViolation,
            UnknownPartition,
        ] {
            assert!(!is_retryable(&delivery(permanent)), "{permanent:?}");
        }
        for transient in [
            MessageTimedOut,
            NotLeaderForPartition,
            RequestTimedOut,
            BrokerTransportFailure,
            AllBrokersDown,
            NotEnoughReplicas,
        ] {
            assert!(is_retryable(&delivery(transient)), "{transient:?}");
        }
    }
}
