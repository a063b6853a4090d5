package fleet

import "sync/atomic"

// enrollmentSecret is the secret devices present to register: the
// Options' one until SetEnrollmentSecret replaces it (a secret rotated in
// its file, read again on SIGHUP). It is the trust room's.
type enrollmentSecret struct{ v atomic.Pointer[string] }

// SetEnrollmentSecret replaces the enrollment secret: registrations from
// now on need the new one, the old one is refused. Registered devices keep
// their tokens.
func (t *trust) SetEnrollmentSecret(secret string) { t.secret.v.Store(&secret) }

// enrollmentSecret is the secret in force.
func (t *trust) enrollmentSecret() string {
	if p := t.secret.v.Load(); p != nil {
		return *p
	}
	return t.defaultSecret
}
