//! The hook through which a relay ships what it records somewhere else. The engine starts
//! shipping once the recorder runs, shows its status in `relay/status`, asks it which sessions
//! retention may count as shipped, and lets it finish after the recorder stopped. Where the
//! recordings go, and how, is the implementation's (`gabp-ship`: NATS JetStream); nothing here
//! names a transport.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use gabp_storage::ship::Destination;
use gabp_storage::Store;
use parking_lot::Mutex;
use serde::Serialize;

/// Where the relay's store is to be found by readers beside the recorder (a resume's history,
/// the shipper's chunks); empty while the recorder reopens it.
pub type StoreSlot = Arc<Mutex<Option<Store>>>;

/// Something that ships a relay's recordings: configured before the relay starts.
pub trait Shipping: Send + Sync + fmt::Debug {
    /// Where it ships, as logs and status show it (never with credentials).
    fn shown_destination(&self) -> String;
    /// Starts shipping what is committed in `store`, on the current tokio runtime.
    fn start(&self, store: StoreSlot) -> Shipment;
}

/// Shipping that has started.
pub struct Shipment {
    /// What it has done so far, read while it runs.
    pub status: Arc<dyn ShippingStatus>,
    /// The running task, finished or stopped by the relay's shutdown.
    pub task: Box<dyn ShippingTask>,
}

/// What shipping has done so far.
pub trait ShippingStatus: Send + Sync + fmt::Debug {
    /// What `relay/status` shows under `ship`.
    fn view(&self) -> ShipView;
    /// The destination shipping last reached (none before it reached one): a session the
    /// destination holds whole counts as shipped for retention.
    fn destination(&self) -> Option<Destination>;
}

/// A running shipping task.
pub trait ShippingTask: Send + fmt::Debug {
    /// Called once the recorder has stopped: ships until nothing is behind, the destination
    /// cannot be reached, or `deadline` (whatever is left ships on the next run).
    fn finish(self: Box<Self>, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    /// Stops at once (the recorder did not stop in time).
    fn stop(self: Box<Self>);
}

/// Shipping as `relay/status` shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShipView {
    /// The destination, without credentials.
    pub to: String,
    /// Whether the last round reached it.
    pub connected: bool,
    /// Frames recorded but not acknowledged yet.
    pub lag_frames: u64,
    /// Body bytes recorded but not acknowledged yet.
    pub lag_bytes: u64,
    /// Frames acknowledged since the relay started.
    pub shipped_frames: u64,
    /// The last error, one line.
    pub last_error: Option<String>,
}
