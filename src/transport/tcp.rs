//! TCP links between ranks on different hosts.
//!
//! Non-blocking sockets with a staging buffer each way, so the progress engine can
//! drive many peers from one thread without blocking on any of them.

use super::Link;
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

const BUF_BYTES: usize = 4 << 20;

pub struct TcpLink {
    peer: usize,
    sock: TcpStream,
    tx: Vec<u8>,
    tx_start: usize,
    tx_end: usize,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    closed: bool,
}

impl TcpLink {
    pub fn new(peer: usize, sock: TcpStream) -> Result<TcpLink> {
        sock.set_nodelay(true)?;
        sock.set_nonblocking(true)?;
        Ok(TcpLink {
            peer,
            sock,
            tx: vec![0; BUF_BYTES],
            tx_start: 0,
            tx_end: 0,
            rx: vec![0; BUF_BYTES],
            rx_start: 0,
            rx_end: 0,
            closed: false,
        })
    }

    fn flush(&mut self) -> Result<bool> {
        let mut moved = false;
        while self.tx_start < self.tx_end {
            match self.sock.write(&self.tx[self.tx_start..self.tx_end]) {
                Ok(0) => return Err(self.lost("connection closed while sending")),
                Ok(n) => {
                    self.tx_start += n;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost(&e.to_string())),
            }
        }
        if self.tx_start == self.tx_end {
            self.tx_start = 0;
            self.tx_end = 0;
        }
        Ok(moved)
    }

    fn fill(&mut self) -> Result<bool> {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx_start > BUF_BYTES / 2 {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        let mut moved = false;
        while self.rx_end < self.rx.len() {
            match self.sock.read(&mut self.rx[self.rx_end..]) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => {
                    self.rx_end += n;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.lost(&e.to_string())),
            }
        }
        Ok(moved)
    }

    fn lost(&self, why: &str) -> Error {
        Error::remote_rank(self.peer, format!("lost the TCP connection to rank {}: {why}", self.peer))
    }
}

impl Link for TcpLink {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send_space(&mut self) -> &mut [u8] {
        if self.tx_start > 0 && self.tx_start == self.tx_end {
            self.tx_start = 0;
            self.tx_end = 0;
        } else if self.tx_start > BUF_BYTES / 2 {
            self.tx.copy_within(self.tx_start..self.tx_end, 0);
            self.tx_end -= self.tx_start;
            self.tx_start = 0;
        }
        let n = (self.tx.len() - self.tx_end) & !7;
        &mut self.tx[self.tx_end..self.tx_end + n]
    }

    fn send_commit(&mut self, n: usize) {
        self.tx_end += n;
        // Errors surface at the next progress().
        let _ = self.flush();
    }

    fn recv_avail(&mut self) -> &[u8] {
        let n = (self.rx_end - self.rx_start) & !7;
        &self.rx[self.rx_start..self.rx_start + n]
    }

    fn recv_commit(&mut self, n: usize) {
        self.rx_start += n;
    }

    fn progress(&mut self) -> Result<bool> {
        let a = self.flush()?;
        let b = self.fill()?;
        Ok(a || b)
    }

    fn check_alive(&self) -> Result<()> {
        if self.closed && self.rx_start == self.rx_end {
            return Err(self.lost("the peer closed the connection (process exited or aborted)"));
        }
        Ok(())
    }

    fn check_flag(&self) -> Result<()> {
        self.check_alive()
    }

    fn poll_fd(&self) -> Option<i32> {
        Some(self.sock.as_raw_fd())
    }

    fn shutdown(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}
