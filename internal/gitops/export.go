package gitops

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	yaml "go.yaml.in/yaml/v3"
)

// Files names the file of each kind in an exported directory.
var Files = map[string]string{
	KindProfilePolicy: "profile-policy.yaml",
	KindSchema:        "schemas.yaml",
	KindProfile:       "profiles.yaml",
	KindLabel:         "labels.yaml",
	KindLabelLayer:    "label-layers.yaml",
	KindDeviceLayer:   "device-layers.yaml",
	KindRolloutPolicy: "rollout-policies.yaml",
	KindAlertRule:     "alert-rules.yaml",
	KindUser:          "users.yaml",
}

// Export reads the server's state as a description: every object apply
// takes, in apply order. Manual labels (their devices are not
// configuration) and secrets are left out; users carry their role only,
// and are left out when the token may not read them (usersSkipped).
func Export(ctx context.Context, api API) (objs []*Object, usersSkipped bool, err error) {
	st, err := fetch(ctx, api, true, true)
	if err != nil {
		return nil, false, err
	}
	return st.sorted(), !st.users, nil
}

// Encode writes objects as YAML documents, in the order given.
func Encode(objs []*Object) []byte {
	var b bytes.Buffer
	for i, o := range objs {
		if i > 0 {
			b.WriteString("---\n")
		}
		n := &yaml.Node{Kind: yaml.MappingNode}
		add := func(k string, v any) {
			var vn yaml.Node
			if err := vn.Encode(v); err != nil {
				vn = yaml.Node{Kind: yaml.ScalarNode, Value: fmt.Sprint(v)}
			}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &vn)
		}
		add("apiVersion", APIVersion)
		add("kind", o.Kind)
		for _, f := range kindFields[o.Kind] {
			if v, ok := o.Fields[f.name]; ok {
				add(f.name, v)
			}
		}
		e := yaml.NewEncoder(&b)
		e.SetIndent(2)
		if err := e.Encode(n); err != nil {
			fmt.Fprintf(&b, "# %v\n", err)
		}
		e.Close()
	}
	return b.Bytes()
}

// WriteDir writes objs into dir, one file per kind (Files); a kind
// without objects gets no file, and its file from an earlier export is
// removed. It returns the files written.
func WriteDir(dir string, objs []*Object) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	byKind := map[string][]*Object{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	var written []string
	for _, k := range Kinds {
		path := filepath.Join(dir, Files[k])
		if len(byKind[k]) == 0 {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return written, err
			}
			continue
		}
		b := append([]byte("# drover ctl export: "+k+"\n"), Encode(byKind[k])...)
		if err := writeFileAtomic(path, b); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	sort.Strings(written)
	return written, nil
}

// writeFileAtomic replaces path with b, never leaving half a file.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
