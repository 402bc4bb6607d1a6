//! Framing (PROTOCOL.md "Framing"): one UTF-8 JSON document, optional
//! whitespace, then the byte 0x03 (ETX). No length prefix, so the reader
//! scans for ETX and refuses to buffer more than the frame limit.

use crate::limits::CONNECTION_BUFFER_RETAINED_BYTES_MAX;

/// The byte that ends every message.
pub const ETX: u8 = 0x03;

/// What went wrong with the framing itself. After this the connection
/// cannot be trusted to find the next message boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// More than the limit arrived without an ETX.
    TooLong { limit_bytes: usize },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLong { limit_bytes } => {
                write!(
                    f,
                    "message longer than the frame limit of {limit_bytes} bytes"
                )
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Bytes received on one connection, cut into frames.
///
/// The buffer is initialised once as it grows and then reused: bytes
/// `start..end` are received and not yet framed, `scanned` of them are
/// known to hold no ETX.
#[derive(Debug)]
pub struct FrameReader {
    data: Vec<u8>,
    start: usize,
    end: usize,
    scanned: usize,
    limit_bytes: usize,
}

impl FrameReader {
    pub fn new(limit_bytes: usize) -> FrameReader {
        FrameReader {
            data: Vec::new(),
            start: 0,
            end: 0,
            scanned: 0,
            limit_bytes,
        }
    }

    /// Space to read into: at most up to the limit plus the ETX, so a
    /// client can never make the buffer grow past the limit.
    pub fn spare(&mut self, chunk_bytes: usize) -> Option<&mut [u8]> {
        let buffered = self.end - self.start;
        let room = (self.limit_bytes + 1).saturating_sub(buffered);
        if room == 0 {
            return None;
        }
        if self.start > 0 && self.end + room.min(chunk_bytes) > self.data.len() {
            self.data.copy_within(self.start..self.end, 0);
            self.end = buffered;
            self.start = 0;
        }
        let wanted = self.end + room.min(chunk_bytes);
        if self.data.len() < wanted {
            self.data.resize(wanted, 0);
        }
        let available = (self.data.len() - self.end).min(room);
        Some(&mut self.data[self.end..self.end + available])
    }

    /// Keeps `filled` bytes of the space handed out by `spare`.
    pub fn commit(&mut self, spare_bytes: usize, filled: usize) {
        debug_assert!(filled <= spare_bytes);
        self.end += filled;
    }

    /// Appends bytes (for tests and in-memory peers).
    pub fn push(&mut self, bytes: &[u8]) {
        self.data.truncate(self.end);
        self.data.extend_from_slice(bytes);
        self.end = self.data.len();
    }

    /// The next complete frame (without its ETX), if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let from = self.start + self.scanned;
        let found = self.data[from..self.end]
            .iter()
            .position(|byte| *byte == ETX)
            .map(|offset| from + offset);
        match found {
            Some(etx) => {
                let frame = self.data[self.start..etx].to_vec();
                self.start = etx + 1;
                self.scanned = 0;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                    if self.data.len() > CONNECTION_BUFFER_RETAINED_BYTES_MAX {
                        self.data = Vec::new();
                    }
                }
                if frame.len() > self.limit_bytes {
                    return Err(FrameError::TooLong {
                        limit_bytes: self.limit_bytes,
                    });
                }
                Ok(Some(frame))
            }
            None => {
                self.scanned = self.end - self.start;
                if self.scanned > self.limit_bytes {
                    return Err(FrameError::TooLong {
                        limit_bytes: self.limit_bytes,
                    });
                }
                Ok(None)
            }
        }
    }

    /// Bytes received but not yet part of a complete frame.
    pub fn buffered_bytes(&self) -> usize {
        self.end - self.start
    }

    /// Bytes the buffer holds on to, received or not.
    pub fn allocated_bytes(&self) -> usize {
        self.data.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_are_cut_at_etx_and_may_arrive_in_pieces() {
        let mut reader = FrameReader::new(1024);
        reader.push(b"{\"a\":1}\x03{\"b\"");
        assert_eq!(reader.next_frame(), Ok(Some(b"{\"a\":1}".to_vec())));
        assert_eq!(reader.next_frame(), Ok(None));
        reader.push(b":2}\n\x03\x03");
        assert_eq!(reader.next_frame(), Ok(Some(b"{\"b\":2}\n".to_vec())));
        assert_eq!(reader.next_frame(), Ok(Some(Vec::new())));
        assert_eq!(reader.next_frame(), Ok(None));
        assert_eq!(reader.buffered_bytes(), 0);
    }

    #[test]
    fn the_limit_is_exact_and_the_buffer_never_grows_past_it() {
        let mut reader = FrameReader::new(8);
        reader.push(b"12345678\x03");
        assert_eq!(reader.next_frame(), Ok(Some(b"12345678".to_vec())));
        let spare = reader.spare(4096).expect("room").len();
        assert_eq!(spare, 9, "the limit plus the ETX");
        reader.commit(spare, 0);
        reader.push(b"123456789");
        assert_eq!(
            reader.next_frame(),
            Err(FrameError::TooLong { limit_bytes: 8 })
        );
        assert!(reader.spare(4096).is_none());
    }

    #[test]
    fn a_large_frame_does_not_leave_a_large_buffer_behind() {
        let mut reader = FrameReader::new(1024 * 1024);
        let mut frame = vec![b' '; 512 * 1024];
        frame.push(ETX);
        let mut offset = 0;
        while offset < frame.len() {
            let spare = reader.spare(64 * 1024).expect("room");
            let len = spare.len().min(frame.len() - offset);
            spare[..len].copy_from_slice(&frame[offset..offset + len]);
            let spare_len = spare.len();
            reader.commit(spare_len, len);
            offset += len;
        }
        assert!(reader.allocated_bytes() > 512 * 1024);
        assert_eq!(
            reader.next_frame().map(|frame| frame.map(|f| f.len())),
            Ok(Some(512 * 1024))
        );
        assert!(reader.allocated_bytes() <= CONNECTION_BUFFER_RETAINED_BYTES_MAX);
        // A small one keeps its buffer of one chunk.
        let spare = reader.spare(64 * 1024).expect("room");
        spare[..2].copy_from_slice(b"x\x03");
        let spare_len = spare.len();
        reader.commit(spare_len, 2);
        assert_eq!(reader.next_frame(), Ok(Some(b"x".to_vec())));
        assert_eq!(reader.allocated_bytes(), 64 * 1024);
    }

    #[test]
    fn spare_and_commit_keep_only_what_was_read() {
        let mut reader = FrameReader::new(100);
        let spare = reader.spare(16).expect("room");
        spare[..3].copy_from_slice(b"x\x03y");
        let len = spare.len();
        reader.commit(len, 3);
        assert_eq!(reader.next_frame(), Ok(Some(b"x".to_vec())));
        assert_eq!(reader.buffered_bytes(), 1);
    }

    proptest! {
        /// Whatever the chunking, the reader yields exactly the messages
        /// sent, in order, and never holds more than the limit plus one.
        #[test]
        fn frames_survive_any_chunking(
            messages in proptest::collection::vec(
                proptest::collection::vec(0u8..=255, 0..300)
                    .prop_map(|bytes| bytes.into_iter().filter(|byte| *byte != ETX).collect::<Vec<u8>>()),
                0..20,
            ),
            cuts in proptest::collection::vec(1usize..700, 0..40),
        ) {
            let mut stream = Vec::new();
            for message in &messages {
                stream.extend_from_slice(message);
                stream.push(ETX);
            }
            let mut reader = FrameReader::new(300);
            let mut received = Vec::new();
            let mut offset = 0;
            let mut cuts = cuts.into_iter().cycle();
            while offset < stream.len() {
                let chunk = cuts.next().unwrap_or(stream.len()).min(stream.len() - offset);
                let spare = reader.spare(chunk).expect("messages fit the limit");
                let len = spare.len().min(chunk);
                spare[..len].copy_from_slice(&stream[offset..offset + len]);
                let spare_len = spare.len();
                reader.commit(spare_len, len);
                offset += len;
                while let Some(frame) = reader.next_frame().expect("within the limit") {
                    received.push(frame);
                }
                prop_assert!(reader.buffered_bytes() <= 301);
            }
            prop_assert_eq!(received, messages);
        }

        /// Bytes without an ETX past the limit are refused, never buffered.
        #[test]
        fn oversized_frames_are_refused(extra in 1usize..5000, limit in 1usize..2000) {
            let mut reader = FrameReader::new(limit);
            let mut fed = 0;
            let mut refused = false;
            while fed < limit + extra {
                let Some(spare) = reader.spare(4096) else {
                    break;
                };
                let len = spare.len().min(limit + extra - fed);
                spare[..len].fill(b'x');
                let spare_len = spare.len();
                reader.commit(spare_len, len);
                fed += len;
                if reader.next_frame().is_err() {
                    refused = true;
                    break;
                }
            }
            prop_assert!(refused || reader.next_frame().is_err());
            prop_assert!(reader.buffered_bytes() <= limit + 1);
        }

        /// Any bytes (ETX anywhere), any chunking, any limit: the reader
        /// agrees with a plain split at ETX. It yields the complete frames
        /// in order up to the first one over the limit, refuses that one
        /// (or a trailing partial frame over the limit), and otherwise
        /// holds exactly the trailing partial frame.
        #[test]
        fn the_reader_agrees_with_a_plain_split(
            stream in proptest::collection::vec(
                prop_oneof![Just(ETX), Just(b'{'), any::<u8>()],
                0..2000,
            ),
            chunks in proptest::collection::vec(0usize..300, 1..30),
            limit in 1usize..400,
        ) {
            // The reference.
            let mut pieces: Vec<&[u8]> = stream.split(|byte| *byte == ETX).collect();
            let partial = pieces.pop().expect("split yields at least one piece");
            let refused_at = pieces.iter().position(|piece| piece.len() > limit);
            let expected: Vec<Vec<u8>> = pieces[..refused_at.unwrap_or(pieces.len())]
                .iter()
                .map(|piece| piece.to_vec())
                .collect();
            let expected_refused = refused_at.is_some() || partial.len() > limit;

            let mut reader = FrameReader::new(limit);
            let mut received = Vec::new();
            let mut refused = false;
            let mut offset = 0;
            // Chunks of 0 are reads that found nothing; one chunk that is
            // not keeps the feed moving.
            let mut chunks = chunks.into_iter().chain([64]).cycle();
            'feed: while offset < stream.len() {
                let chunk = chunks.next().expect("cycled").min(stream.len() - offset);
                let Some(spare) = reader.spare(chunk.max(1)) else {
                    // Full: only a frame over the limit can fill it.
                    refused = reader.next_frame().is_err();
                    prop_assert!(refused, "the buffer is full but nothing was refused");
                    break;
                };
                let len = spare.len().min(chunk);
                spare[..len].copy_from_slice(&stream[offset..offset + len]);
                let spare_len = spare.len();
                reader.commit(spare_len, len);
                offset += len;
                loop {
                    match reader.next_frame() {
                        Ok(Some(frame)) => received.push(frame),
                        Ok(None) => break,
                        Err(FrameError::TooLong { limit_bytes }) => {
                            prop_assert_eq!(limit_bytes, limit);
                            refused = true;
                            break 'feed;
                        }
                    }
                }
                prop_assert!(reader.buffered_bytes() <= limit + 1);
            }
            prop_assert_eq!(&received, &expected);
            prop_assert_eq!(refused, expected_refused);
            if !refused {
                prop_assert_eq!(reader.buffered_bytes(), partial.len());
            }
        }
    }
}
