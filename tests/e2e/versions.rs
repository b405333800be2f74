//! The main job, walsender termination, server restarts and large transactions on every
//! PostgreSQL major the relay supports beyond the suite's own 15: the same test bodies as the
//! modules that run them on 15 (`delivery`, `connection`, `server_failures`), each on the run's
//! cluster of PostgreSQL 16, 17 and 18 (tests/setup-deps.sh installs them; see
//! `support::pg::MAJORS`).

/// For each `module = major`, a module of tests running the shared bodies on that major.
macro_rules! on_major {
    ($($module:ident = $major:literal),* $(,)?) => {$(
        mod $module {
            use crate::support::pg::pg_major;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ten_thousand_events_arrive_once_in_order_and_the_slot_catches_up() {
                crate::delivery::ten_thousand_events_arrive_once_in_order_and_the_slot_catches_up_on(
                    pg_major($major),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rolled_back_work_is_never_published_and_the_lsn_moves_past_it() {
                crate::delivery::rolled_back_work_is_never_published_and_the_lsn_moves_past_it_on(
                    pg_major($major),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_100k_row_transaction_streams_through_bounded_memory_in_key_order() {
                crate::delivery::a_100k_row_transaction_streams_through_bounded_memory_in_key_order_on(
                    pg_major($major),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reconnects_after_the_walsender_is_terminated_and_loses_nothing() {
                crate::connection::reconnects_after_the_walsender_is_terminated_and_loses_nothing_on(
                    pg_major($major),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn server_restarts_fast_and_immediate_lose_nothing_and_publish_nothing_uncommitted() {
                crate::server_failures::server_restarts_fast_and_immediate_lose_nothing_and_publish_nothing_uncommitted_on(
                    $major,
                )
                .await;
            }
        }
    )*};
}

on_major!(pg16 = 16, pg17 = 17, pg18 = 18);
