// Package transport holds what the server's listeners need below HTTP:
// the device listener (Listen) and the sockets a process is given by
// systemd or by the one it replaces (Inherited, HandoverReady), the TLS
// policy (Policy), session ticket
// keys (SetTicketKeys), ACME certificates (NewACME), certificate files and
// their watching (LoadKeyPair, WatchFiles, SelfSigned), the
// registration rate limits (RegisterLimiter), the accept gate (Gate),
// what the server remembers per connection (Conn) and the over-quota
// tarpit's bookkeeping (Tarpit).
//
// It imports nothing of Drover but internal/protocol (the key exchange
// and TLS version names shared with the agent): the server composes it
// with its configuration, and error messages name the server's flags.
package transport
