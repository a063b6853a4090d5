package server

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/store"
)

// OpenAccess opens the store of cfg for `drover user`: its users, tokens
// and audit log, without a server. It takes the store's instance lock, so
// it fails while a server runs on the store (then use the API with the
// admin token, docs/security.md). close closes the store.
func OpenAccess(ctx context.Context, cfg Config) (svc *access.Service, close func() error, err error) {
	if cfg.Persistence == "memory" {
		return nil, nil, errors.New("a memory-mode server keeps no users; create them through the API with the admin token")
	}
	if cfg.DB == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return nil, nil, err
		}
	}
	st, err := openStore(ctx, cfg.dbDSN())
	if err != nil {
		var held *store.HeldError
		if errors.As(err, &held) {
			return nil, nil, fmt.Errorf("%w\nthe server is running: manage users through the API or the dashboard with the admin token (docs/security.md)", err)
		}
		return nil, nil, err
	}
	return access.New(access.Options{Store: st}), st.Close, nil
}
