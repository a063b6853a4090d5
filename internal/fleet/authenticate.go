package fleet

// Device tokens and the device's profile, for the transports (the
// registry's, the Service's own room).

import (
	"context"
	"crypto/subtle"
	"errors"
)

// Authenticate returns the ID of the device a token belongs to, if the
// device may push (ErrUnauthorized, or an admission error, otherwise). In
// cluster mode a token memory refuses is checked against the database
// first, as a push's is.
func (s *Service) Authenticate(ctx context.Context, token string) (uint64, error) {
	id, err := s.authenticate(token)
	if errors.Is(err, ErrUnauthorized) {
		if ok, cerr := s.checkStored(ctx, token); cerr != nil {
			return 0, cerr
		} else if ok {
			return s.authenticate(token)
		}
	}
	return id, err
}

func (s *Service) authenticate(token string) (uint64, error) {
	d, hash, ok := s.deviceForToken(token)
	if !ok {
		return 0, ErrUnauthorized
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if subtle.ConstantTimeCompare(hash[:], d.tokenHash[:]) != 1 {
		return 0, ErrUnauthorized
	}
	if err := admissionError(d.admission); err != nil {
		return 0, err
	}
	return d.id, nil
}

// ProfileOf returns the ID of a device's profile (0: unknown device).
func (s *Service) ProfileOf(id uint64) uint64 {
	d := s.get(id)
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.profile == nil {
		return 0
	}
	return d.profile.get().ID
}
