package alert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/mail"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	gomail "github.com/wneessen/go-mail"
)

// Retry is the notification retry policy: waits double from First up to
// Max, for Attempts tries in all.
type Retry struct {
	First    time.Duration // default 2 s
	Max      time.Duration // default 5 min
	Attempts int           // default 8
}

func (r Retry) withDefaults() Retry {
	if r.First <= 0 {
		r.First = 2 * time.Second
	}
	if r.Max <= 0 {
		r.Max = 5 * time.Minute
	}
	if r.Attempts <= 0 {
		r.Attempts = 8
	}
	return r
}

// IDList is a list of IDs, written as decimal strings like every ID of
// the API.
type IDList []uint64

// MarshalJSON writes the IDs as strings.
func (l IDList) MarshalJSON() ([]byte, error) {
	out := make([]string, len(l))
	for i, id := range l {
		out[i] = strconv.FormatUint(id, 10)
	}
	return json.Marshal(out)
}

// Delivery is one notification: a batch of events sent to one destination.
type Delivery struct {
	ID          uint64     `json:"id,string"`
	Channel     string     `json:"channel"` // webhook or email
	Target      string     `json:"target"`  // URL or recipients
	EventIDs    IDList     `json:"event_ids"`
	State       string     `json:"state"` // sending, retrying, delivered, failed
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
}

// Delivery states.
const (
	Sending   = "sending"
	Retrying  = "retrying"
	Delivered = "delivered"
	Failed    = "failed"
)

// SMTPSettings tell how to send e-mail.
type SMTPSettings struct {
	Addr     string `json:"addr"` // host:port of the relay
	From     string `json:"from"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// TLS: "starttls" (default: STARTTLS, required: a relay that does not
	// offer it gets no message), "tls" (implicit TLS, usually port 465) or
	// "none" (plain text, no STARTTLS: only when asked for explicitly).
	TLS string `json:"tls,omitempty"`
}

// Normalize checks the settings; empty Addr means e-mail is off.
func (s *SMTPSettings) Normalize() error {
	if s.TLS == "" {
		s.TLS = "starttls"
	}
	if s.TLS != "starttls" && s.TLS != "tls" && s.TLS != "none" {
		return errors.New("tls must be starttls, tls or none")
	}
	if s.Addr == "" {
		return nil
	}
	if _, port, err := net.SplitHostPort(s.Addr); err != nil || port == "" {
		return errors.New("addr must be host:port")
	}
	a, err := mail.ParseAddress(s.From)
	if err != nil {
		return fmt.Errorf("from: %v", err)
	}
	s.From = a.Address
	return nil
}

const (
	maxQueued  = 10000 // events waiting per destination; more are dropped
	maxBatch   = 100   // events per notification
	keptStatus = 200   // deliveries kept for display
)

type destKey struct{ channel, target string }

type dest struct {
	key     destKey
	queue   []Event
	dropped int
	wake    chan struct{}
	running bool
}

// notifier batches events per destination and delivers them with retries.
type notifier struct {
	e     *Engine
	retry Retry

	mu         sync.Mutex
	ctx        context.Context // set by run
	wg         sync.WaitGroup
	dests      map[destKey]*dest
	deliveries []*Delivery // newest last, at most keptStatus
	nextID     uint64
	counts     map[[2]string]uint64 // channel, outcome
	smtp       SMTPSettings
}

func newNotifier(e *Engine) *notifier {
	return &notifier{e: e, retry: e.opts.Retry.withDefaults(), dests: map[destKey]*dest{}, counts: map[[2]string]uint64{}}
}

// send queues ev for the rule's destinations.
func (n *notifier) send(r *Rule, ev Event) {
	if r.Webhook != "" {
		n.queue(destKey{"webhook", r.Webhook}, ev)
	}
	if len(r.Email) > 0 {
		n.queue(destKey{"email", strings.Join(r.Email, ", ")}, ev)
	}
}

func (n *notifier) queue(k destKey, ev Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d := n.dests[k]
	if d == nil {
		d = &dest{key: k, wake: make(chan struct{}, 1)}
		n.dests[k] = d
	}
	if len(d.queue) >= maxQueued {
		d.dropped++
		n.counts[[2]string{k.channel, "dropped"}]++
		return
	}
	d.queue = append(d.queue, ev)
	if !d.running && n.ctx != nil {
		n.start(d)
	}
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// start runs d's sender; n.mu held.
func (n *notifier) start(d *dest) {
	d.running = true
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.sender(n.ctx, d)
	}()
}

func (n *notifier) run(ctx context.Context) {
	n.mu.Lock()
	n.ctx = ctx
	for _, d := range n.dests {
		if !d.running {
			n.start(d)
		}
	}
	n.mu.Unlock()
	<-ctx.Done()
	n.wg.Wait()
}

func (n *notifier) sender(ctx context.Context, d *dest) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		}
		for ctx.Err() == nil {
			n.mu.Lock()
			k := min(len(d.queue), maxBatch)
			batch := d.queue[:k:k]
			d.queue = d.queue[k:]
			n.mu.Unlock()
			if k == 0 {
				break
			}
			n.deliver(ctx, d.key, batch)
		}
	}
}

// permanent marks errors that retrying cannot fix.
type permanent struct{ error }

func (n *notifier) deliver(ctx context.Context, k destKey, batch []Event) {
	now := n.e.now()
	dl := &Delivery{Channel: k.channel, Target: k.target, State: Sending, CreatedAt: now, UpdatedAt: now}
	for _, ev := range batch {
		dl.EventIDs = append(dl.EventIDs, ev.ID)
	}
	n.mu.Lock()
	n.nextID++
	dl.ID = n.nextID
	n.deliveries = append(n.deliveries, dl)
	if len(n.deliveries) > keptStatus {
		n.deliveries = append(n.deliveries[:0:0], n.deliveries[len(n.deliveries)-keptStatus:]...)
	}
	n.mu.Unlock()

	wait := n.retry.First
	for attempt := 1; ; attempt++ {
		var err error
		if k.channel == "webhook" {
			err = n.webhook(ctx, k.target, batch)
		} else {
			err = n.email(ctx, k.target, batch)
		}
		var perm permanent
		n.mu.Lock()
		dl.Attempts, dl.UpdatedAt, dl.NextAttempt = attempt, n.e.now(), nil
		switch {
		case err == nil:
			dl.State, dl.LastError = Delivered, ""
			n.counts[[2]string{k.channel, "delivered"}]++
		case errors.As(err, &perm) || attempt >= n.retry.Attempts || ctx.Err() != nil:
			dl.State, dl.LastError = Failed, err.Error()
			n.counts[[2]string{k.channel, "failed"}]++
		default:
			dl.State, dl.LastError = Retrying, err.Error()
			next := dl.UpdatedAt.Add(wait)
			dl.NextAttempt = &next
			n.counts[[2]string{k.channel, "retried"}]++
		}
		state := dl.State
		n.mu.Unlock()
		if state != Retrying {
			if state == Failed {
				n.e.log.Warn("alert notification failed", "channel", k.channel, "target", logTarget(k.channel, k.target), "attempts", attempt, "err", err)
			}
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			n.mu.Lock()
			dl.State, dl.LastError, dl.NextAttempt = Failed, "server shutting down; last error: "+err.Error(), nil
			n.counts[[2]string{k.channel, "failed"}]++
			n.mu.Unlock()
			return
		case <-t.C:
		}
		wait = min(2*wait, n.retry.Max)
	}
}

// WebhookBody is the JSON a webhook receives.
type WebhookBody struct {
	Source string  `json:"source"` // "drover"
	Events []Event `json:"events"`
}

func (n *notifier) webhook(ctx context.Context, target string, batch []Event) error {
	body, err := json.Marshal(WebhookBody{Source: "drover", Events: batch})
	if err != nil {
		return permanent{err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return permanent{redactURLError(err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "drover-alerts")
	resp, err := n.e.opts.HTTPClient.Do(req)
	if err != nil {
		return redactURLError(err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != 408 && resp.StatusCode != 429:
		return permanent{fmt.Errorf("HTTP %s", resp.Status)}
	}
	return fmt.Errorf("HTTP %s", resp.Status)
}

// logTarget is a notification target as the log shows it: a webhook URL
// without its path, query and user (chat services put their secret
// there), e-mail recipients as they are.
func logTarget(channel, target string) string {
	if channel != "webhook" {
		return target
	}
	return redactURL(target)
}

// redactURL is scheme://host of u, and "/…" when u had more.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return "(a URL that does not parse)"
	}
	s := p.Scheme + "://" + p.Host
	if (p.Path != "" && p.Path != "/") || p.RawQuery != "" || p.Opaque != "" {
		s += "/…"
	}
	return s
}

// redactURLError is err with the URL it names (net/http's errors name
// the request's) redacted.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = redactURL(ue.URL)
	}
	return err
}

func (n *notifier) email(ctx context.Context, to string, batch []Event) error {
	n.mu.Lock()
	cfg := n.smtp
	n.mu.Unlock()
	if cfg.Addr == "" {
		return errors.New("SMTP is not configured (alert settings)")
	}
	rcpts := strings.Split(to, ", ")
	msg, err := composeMail(cfg.From, rcpts, batch, n.e.now())
	if err != nil {
		return err
	}
	return sendMail(ctx, cfg, n.e.opts.SMTPRootCAs, msg)
}

// composeMail is the message of a batch of events: plain UTF-8 text.
func composeMail(from string, to []string, batch []Event, now time.Time) (*gomail.Msg, error) {
	var raised, cleared int
	for _, ev := range batch {
		if ev.State == Raised {
			raised++
		} else {
			cleared++
		}
	}
	first := batch[0]
	subject := fmt.Sprintf("[Drover] %s: %s on device %d", first.State, first.Rule, first.DeviceID)
	if len(batch) > 1 {
		subject = fmt.Sprintf("[Drover] %d alerts raised, %d cleared", raised, cleared)
	}
	var b strings.Builder
	for _, ev := range batch {
		when := ev.RaisedAt
		if ev.ClearedAt != nil {
			when = *ev.ClearedAt
		}
		fmt.Fprintf(&b, "%s  %-7s  %-8s  %s  device %d (%s): %s", when.Format(time.RFC3339), ev.State, ev.Severity, ev.Rule,
			ev.DeviceID, ev.DeviceType, ev.Message)
		if ev.ClearReason != "" {
			fmt.Fprintf(&b, " (cleared: %s)", ev.ClearReason)
		}
		b.WriteString("\r\n")
	}
	m := gomail.NewMsg(gomail.WithCharset(gomail.CharsetUTF8), gomail.WithEncoding(gomail.NoEncoding))
	if err := m.From(from); err != nil {
		return nil, permanent{fmt.Errorf("from: %w", err)}
	}
	if err := m.To(to...); err != nil {
		return nil, permanent{fmt.Errorf("to: %w", err)}
	}
	m.Subject(subject)
	m.SetDateWithValue(now)
	m.SetMessageID()
	m.SetBodyString(gomail.TypeTextPlain, b.String())
	return m, nil
}

// sendMail sends msg through the relay of cfg with
// github.com/wneessen/go-mail. STARTTLS is required unless cfg.TLS is
// "none": a relay that does not offer it (or whose offer was stripped on
// the way) gets no message in plain text.
func sendMail(ctx context.Context, cfg SMTPSettings, roots *x509.CertPool, msg *gomail.Msg) error {
	host, portStr, _ := net.SplitHostPort(cfg.Addr)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return permanent{fmt.Errorf("addr %q: %w", cfg.Addr, err)}
	}
	opts := []gomail.Option{
		gomail.WithTimeout(60 * time.Second), gomail.WithHELO("drover"),
		gomail.WithTLSConfig(&tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, RootCAs: roots}),
	}
	switch cfg.TLS {
	case "tls":
		opts = append(opts, gomail.WithSSL())
	case "none":
		opts = append(opts, gomail.WithTLSPortPolicy(gomail.NoTLS))
	default:
		opts = append(opts, gomail.WithTLSPortPolicy(gomail.TLSMandatory))
	}
	if cfg.Username != "" {
		opts = append(opts, gomail.WithSMTPAuth(gomail.SMTPAuthPlain), gomail.WithUsername(cfg.Username), gomail.WithPassword(cfg.Password))
	}
	opts = append(opts, gomail.WithPort(port)) // after the TLS policy, which picks a port of its own
	c, err := gomail.NewClient(host, opts...)
	if err != nil {
		return permanent{err}
	}
	if err := c.DialAndSendWithContext(ctx, msg); err != nil {
		return smtpErr(err)
	}
	return nil
}

// smtpErr makes 5xx answers permanent.
func smtpErr(err error) error {
	var se *gomail.SendError
	if errors.As(err, &se) && se.ErrorCode() >= 500 {
		return permanent{err}
	}
	var te *textproto.Error
	if errors.As(err, &te) && te.Code >= 500 {
		return permanent{err}
	}
	return err
}

// Deliveries returns the recent notifications, newest first.
func (e *Engine) Deliveries() []Delivery {
	n := e.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Delivery, 0, len(n.deliveries))
	for i := len(n.deliveries) - 1; i >= 0; i-- {
		d := *n.deliveries[i]
		d.EventIDs = append([]uint64(nil), d.EventIDs...)
		out = append(out, d)
	}
	return out
}

// Queued returns the events waiting per destination and those dropped
// because a queue was full.
func (e *Engine) Queued() (queued, dropped map[string]int) {
	n := e.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	queued, dropped = map[string]int{}, map[string]int{}
	for k, d := range n.dests {
		name := k.channel + " " + k.target
		queued[name] = len(d.queue)
		if d.dropped > 0 {
			dropped[name] = d.dropped
		}
	}
	return queued, dropped
}

const smtpKey = "smtp"

// SMTP returns the e-mail settings.
func (e *Engine) SMTP() SMTPSettings {
	e.notify.mu.Lock()
	defer e.notify.mu.Unlock()
	return e.notify.smtp
}

// SetSMTPPassword replaces the SMTP password from a file
// (Options.SMTPPassword; the file is read again on SIGHUP): the next
// e-mail uses it, and it is never stored. An engine without a password
// from a file ignores it.
func (e *Engine) SetSMTPPassword(p string) {
	e.notify.mu.Lock()
	defer e.notify.mu.Unlock()
	if e.opts.SMTPPassword == "" || p == "" {
		return
	}
	e.opts.SMTPPassword = p
	e.notify.smtp.Password = p
}

// filePassword is the SMTP password from a file; "" for none.
func (e *Engine) filePassword() string {
	e.notify.mu.Lock()
	defer e.notify.mu.Unlock()
	return e.opts.SMTPPassword
}

// storedSMTP is SMTPSettings as stored: the password sealed, never plain.
type storedSMTP struct {
	SMTPSettings
	Password       string `json:"password,omitempty"` // plain: only in stores written before sealing
	PasswordSealed string `json:"password_sealed,omitempty"`
}

// SetSMTP validates and stores the e-mail settings. An empty Password keeps
// the stored one when the username is unchanged.
func (e *Engine) SetSMTP(ctx context.Context, s SMTPSettings) (SMTPSettings, error) {
	if err := s.Normalize(); err != nil {
		return SMTPSettings{}, err
	}
	cur := e.SMTP()
	if s.Password == "" && s.Username == cur.Username {
		s.Password = cur.Password
	}
	if p := e.filePassword(); p != "" {
		s.Password = p
	}
	if err := e.saveSMTP(ctx, s); err != nil {
		return SMTPSettings{}, err
	}
	e.notify.mu.Lock()
	e.notify.smtp = s
	e.notify.mu.Unlock()
	e.changed(ctx)
	return s, nil
}

// saveSMTP stores s with its password sealed (or left out: taken from a
// file, or no key to seal it with).
func (e *Engine) saveSMTP(ctx context.Context, s SMTPSettings) error {
	st := storedSMTP{SMTPSettings: s}
	st.SMTPSettings.Password = ""
	if s.Password != "" && e.filePassword() == "" && e.opts.SecretKey != nil {
		sealed, err := seal(e.opts.SecretKey, s.Password)
		if err != nil {
			return err
		}
		st.PasswordSealed = sealed
	}
	b, _ := json.Marshal(st)
	return e.store.PutSetting(ctx, smtpKey, string(b))
}

func (e *Engine) loadSMTP(ctx context.Context) error {
	v, err := e.store.Setting(ctx, smtpKey)
	if err != nil {
		return err
	}
	var st storedSMTP
	if v != "" {
		if err := json.Unmarshal([]byte(v), &st); err != nil {
			return fmt.Errorf("stored SMTP settings: %w", err)
		}
	}
	s := st.SMTPSettings
	switch {
	case e.filePassword() != "":
		s.Password = e.filePassword()
	case st.PasswordSealed != "":
		p, err := unseal(e.opts.SecretKey, st.PasswordSealed)
		if err != nil {
			e.log.Error("stored SMTP password unreadable; set it again", "err", err)
		}
		s.Password = p
	case st.Password != "":
		// Written before passwords were sealed: seal it now.
		s.Password = st.Password
		if err := e.saveSMTP(ctx, s); err != nil {
			return fmt.Errorf("sealing the stored SMTP password: %w", err)
		}
	}
	e.notify.mu.Lock()
	e.notify.smtp = s
	e.notify.mu.Unlock()
	return nil
}

// NotificationCounts returns notifications by channel and outcome
// (delivered, failed, retried, dropped).
func (e *Engine) NotificationCounts() map[[2]string]uint64 {
	n := e.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[[2]string]uint64, len(n.counts))
	for k, v := range n.counts {
		out[k] = v
	}
	return out
}
