//! [`TcpConnector`]: the connection pool's connector over async-std's TCP.

use core::future::Future;

use async_std::net::TcpStream;
use throttle_core::sync::Connector;

/// Opens an `async_std::net::TcpStream` to `host:port` (host resolved by async-std), with
/// `TCP_NODELAY` set unless turned off. `&TcpStream` reads and writes, so leases of one pooled
/// connection can share it; wrap this connector to put a multiplexing client on top.
#[derive(Debug, Clone, Copy)]
pub struct TcpConnector {
    nodelay: bool,
}

impl TcpConnector {
    /// A connector setting `TCP_NODELAY` (requests are small and latency-bound).
    pub fn new() -> Self {
        TcpConnector { nodelay: true }
    }

    /// This connector with `TCP_NODELAY` set to `nodelay`.
    pub fn with_nodelay(self, nodelay: bool) -> Self {
        TcpConnector { nodelay }
    }
}

impl Default for TcpConnector {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: AsRef<str>> Connector<H> for TcpConnector {
    type Conn = TcpStream;
    type Error = std::io::Error;

    fn connect(
        &self,
        host: &H,
        port: u16,
    ) -> impl Future<Output = Result<TcpStream, std::io::Error>> + Send + 'static {
        let addr = (host.as_ref().to_owned(), port);
        let nodelay = self.nodelay;
        async move {
            let stream = TcpStream::connect((addr.0.as_str(), addr.1)).await?;
            stream.set_nodelay(nodelay)?;
            Ok(stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connects_to_a_loopback_listener_with_nodelay() {
        async_std::task::block_on(async {
            let listener = async_std::net::TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap();
            let port = listener.local_addr().unwrap().port();
            let stream = TcpConnector::new()
                .connect(&"127.0.0.1", port)
                .await
                .unwrap();
            assert!(stream.nodelay().unwrap());
            assert_eq!(stream.peer_addr().unwrap().port(), port);
        });
    }
}
