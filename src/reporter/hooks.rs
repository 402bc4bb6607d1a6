//! Hooks: commands run on events (EVENTS.md, "Hooks").
