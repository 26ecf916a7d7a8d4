package nodeapi

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// The store keeps, per caller identity, the objects that caller read: what
// LIST, GET and WATCH answered it while the API server was reachable. It
// lives in memory and is written to one bbolt file a moment after it
// changes, so a reboot finds it. Secrets and issued tokens are sealed with a
// key kept in a file of its own.

var (
	bObjects     = []byte("objects")
	bCollections = []byte("collections")
	bTokens      = []byte("tokens")
	bCredentials = []byte("credentials")
	bDiscovery   = []byte("discovery")
	bMeta        = []byte("meta")

	kOfflineSince = []byte("offline-since")
)

// sealed collections hold what must not lie on disk in the clear.
var sealed = map[string]bool{"v1/secrets": true}

type collection struct {
	// ListKind and APIVersion answer a list when offline.
	ListKind   string `json:"listKind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	// ResourceVersion is the newest the API server gave this caller.
	ResourceVersion string `json:"resourceVersion,omitempty"`
	// Scopes are the scopes (namespace, selectors) lists or watch lists
	// were answered for: an offline list is answered only within one of
	// them, where the store knows every object (a collection known from
	// GETs alone has none).
	Scopes  []string                   `json:"scopes,omitempty"`
	objects map[string]json.RawMessage // namespace/name -> object
}

func scopeOf(namespace string, r apiRequest) string {
	sel := func(s fmt.Stringer) string {
		if s == nil {
			return ""
		}
		return s.String()
	}
	return namespace + "|" + sel(r.labels) + "|" + sel(r.fields)
}

// covers says whether a list in r's scope was answered before: the same
// namespace and selectors, or the same selectors over all namespaces.
func (c *collection) covers(r apiRequest) bool {
	return slices.Contains(c.Scopes, scopeOf(r.namespace, r)) || slices.Contains(c.Scopes, scopeOf("", r))
}

// credential is a bearer token the API server accepted, by its hash: only
// such a token is served offline, and only until it expires.
type credential struct {
	Identity string    `json:"identity"`
	Expires  time.Time `json:"expires"`
}

// rawAnswer is a discovery answer (what groups, versions and resources the
// API server serves), kept as it came for the same path and Accept header.
type rawAnswer struct {
	ContentType string `json:"contentType"`
	Body        []byte `json:"body"`
}

// tokenAnswer is a TokenRequest's answer, served again offline to the same
// request while the token it holds is valid.
type tokenAnswer struct {
	Body    []byte    `json:"body"`
	Expires time.Time `json:"expires"`
}

type store struct {
	db   *bolt.DB
	aead cipher.AEAD

	mu          sync.Mutex
	collections map[string]*collection // identity \x00 collection
	credentials map[string]credential  // sha256 of the token
	tokens      map[string]tokenAnswer // identity \x00 request hash
	discovery   map[string]rawAnswer   // identity \x00 path \x00 Accept
	dirty       map[string]bool        // bucket \x00 key
}

func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := loadOrMakeKey(filepath.Join(dir, "seal.key"))
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(dir, "store.db"), 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("node API store: %w", err)
	}
	s := &store{db: db, aead: aead, collections: map[string]*collection{}, credentials: map[string]credential{},
		tokens: map[string]tokenAnswer{}, discovery: map[string]rawAnswer{}, dirty: map[string]bool{}}
	if err := s.load(); err != nil {
		db.Close()
		return nil, fmt.Errorf("node API store %s: %w", filepath.Join(dir, "store.db"), err)
	}
	return s, nil
}

func loadOrMakeKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err == nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("%s: %d bytes, want 32", path, len(key))
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return key, os.WriteFile(path, key, 0o600)
}

func (s *store) seal(b []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, b, nil)
}

func (s *store) open(b []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(b) < n {
		return nil, errors.New("sealed value too short")
	}
	return s.aead.Open(nil, b[:n], b[n:], nil)
}

func (s *store) load() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bObjects, bCollections, bTokens, bCredentials, bDiscovery, bMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bCollections).ForEach(func(k, v []byte) error {
			c := &collection{objects: map[string]json.RawMessage{}}
			if err := json.Unmarshal(v, c); err != nil {
				return fmt.Errorf("collection %q: %w", k, err)
			}
			s.collections[string(k)] = c
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bObjects).ForEach(func(k, v []byte) error {
			ck, key, ok := splitObjectKey(string(k))
			c := s.collections[ck]
			if !ok || c == nil {
				return nil
			}
			if sealed[collectionOf(ck)] {
				var err error
				if v, err = s.open(v); err != nil {
					return fmt.Errorf("object %q: %w", k, err)
				}
			}
			c.objects[key] = slices.Clone(v)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bDiscovery).ForEach(func(k, v []byte) error {
			var a rawAnswer
			if err := json.Unmarshal(v, &a); err != nil {
				return err
			}
			s.discovery[string(k)] = a
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bCredentials).ForEach(func(k, v []byte) error {
			var c credential
			if err := json.Unmarshal(v, &c); err != nil {
				return err
			}
			s.credentials[string(k)] = c
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bTokens).ForEach(func(k, v []byte) error {
			raw, err := s.open(v)
			if err != nil {
				return fmt.Errorf("token %q: %w", k, err)
			}
			var t tokenAnswer
			if err := json.Unmarshal(raw, &t); err != nil {
				return err
			}
			s.tokens[string(k)] = t
			return nil
		})
	})
}

func collectionKey(identity, coll string) string { return identity + "\x00" + coll }

func collectionOf(ck string) string {
	_, c, _ := strings.Cut(ck, "\x00")
	return c
}

func objectKey(ck, key string) string { return ck + "\x00" + key }

func splitObjectKey(k string) (ck, key string, ok bool) {
	i := strings.LastIndexByte(k, 0)
	if i < 0 {
		return "", "", false
	}
	return k[:i], k[i+1:], true
}

// coll returns the collection, made if missing. Callers hold mu.
func (s *store) coll(ck string) *collection {
	c := s.collections[ck]
	if c == nil {
		c = &collection{objects: map[string]json.RawMessage{}}
		s.collections[ck] = c
	}
	return c
}

func (s *store) markDirty(bucket []byte, key string) { s.dirty[string(bucket)+"\x00"+key] = true }

// objectMeta is the part of an object the store reads.
type objectMeta struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
		Continue        string            `json:"continue"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
}

func (m objectMeta) key() string { return m.Metadata.Namespace + "/" + m.Metadata.Name }

// put keeps one object a caller read.
func (s *store) put(identity string, r apiRequest, raw json.RawMessage) error {
	var m objectMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	if m.Metadata.Name == "" {
		return errors.New("object without a name")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ck := collectionKey(identity, r.collection())
	c := s.coll(ck)
	if m.Kind != "" {
		c.ListKind, c.APIVersion = m.Kind+"List", m.APIVersion
	}
	c.objects[m.key()] = slices.Clone(raw)
	s.newer(c, m.Metadata.ResourceVersion)
	s.markDirty(bObjects, objectKey(ck, m.key()))
	s.markDirty(bCollections, ck)
	return nil
}

// remove forgets one object (deleted, or gone from a list).
func (s *store) remove(identity string, r apiRequest, namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ck := collectionKey(identity, r.collection())
	c := s.coll(ck)
	key := namespace + "/" + name
	if _, ok := c.objects[key]; ok {
		delete(c.objects, key)
		s.markDirty(bObjects, objectKey(ck, key))
	}
}

// newer keeps the highest resource version seen. Versions are opaque to
// clients, but the API server's are integers; an unparsable one replaces.
func (s *store) newer(c *collection, rv string) {
	if rv == "" {
		return
	}
	a, errA := strconv.ParseUint(c.ResourceVersion, 10, 64)
	b, errB := strconv.ParseUint(rv, 10, 64)
	if errA != nil || errB != nil || b > a {
		c.ResourceVersion = rv
	}
}

// replace makes a collection's objects in the request's scope exactly the
// ones given (a complete list or a watch list's initial events).
func (s *store) replace(identity string, r apiRequest, listKind, apiVersion, rv string, items []json.RawMessage) error {
	keep := map[string]json.RawMessage{}
	for _, raw := range items {
		var m objectMeta
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		keep[m.key()] = raw
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ck := collectionKey(identity, r.collection())
	c := s.coll(ck)
	for key, raw := range c.objects {
		if _, ok := keep[key]; ok {
			continue
		}
		if ok, _ := r.selects(raw); ok {
			delete(c.objects, key)
			s.markDirty(bObjects, objectKey(ck, key))
		}
	}
	for key, raw := range keep {
		c.objects[key] = slices.Clone(raw)
		s.markDirty(bObjects, objectKey(ck, key))
	}
	if listKind != "" {
		c.ListKind, c.APIVersion = listKind, apiVersion
	}
	if scope := scopeOf(r.namespace, r); !slices.Contains(c.Scopes, scope) {
		c.Scopes = append(c.Scopes, scope)
	}
	s.newer(c, rv)
	s.markDirty(bCollections, ck)
	return nil
}

// bookmark records a resource version a watch reached.
func (s *store) bookmark(identity string, r apiRequest, rv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ck := collectionKey(identity, r.collection())
	s.newer(s.coll(ck), rv)
	s.markDirty(bCollections, ck)
}

// errNotKept is an offline read of something this caller never read.
var errNotKept = errors.New("not kept on this node")

// get answers one object offline.
func (s *store) get(identity string, r apiRequest) (json.RawMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collections[collectionKey(identity, r.collection())]
	if c == nil {
		return nil, errNotKept
	}
	raw, ok := c.objects[r.namespace+"/"+r.name]
	if !ok {
		return nil, errNotKept
	}
	return withKind(raw, strings.TrimSuffix(c.ListKind, "List"), c.APIVersion), nil
}

// list answers a list offline: the kept objects the request selects and
// keep (nil: all) takes.
func (s *store) list(identity string, r apiRequest, keep func(json.RawMessage) bool) (json.RawMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collections[collectionKey(identity, r.collection())]
	if c == nil || c.ListKind == "" || !c.covers(r) {
		return nil, errNotKept
	}
	keys := make([]string, 0, len(c.objects))
	for k := range c.objects {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	items := []json.RawMessage{}
	for _, k := range keys {
		raw := c.objects[k]
		ok, err := r.selects(raw)
		if err != nil {
			return nil, err
		}
		if ok && (keep == nil || keep(raw)) {
			items = append(items, raw)
		}
	}
	return json.Marshal(map[string]any{
		"kind": c.ListKind, "apiVersion": c.APIVersion,
		"metadata": map[string]any{"resourceVersion": c.ResourceVersion},
		"items":    items,
	})
}

// size counts the objects kept and their bytes.
func (s *store) size() (objects, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.collections {
		for _, raw := range c.objects {
			objects++
			bytes += len(raw)
		}
	}
	return objects, bytes
}

func withKind(raw json.RawMessage, kind, apiVersion string) json.RawMessage {
	var m map[string]json.RawMessage
	if kind == "" || json.Unmarshal(raw, &m) != nil {
		return raw
	}
	if _, ok := m["kind"]; ok {
		return raw
	}
	m["kind"], _ = json.Marshal(kind)
	m["apiVersion"], _ = json.Marshal(apiVersion)
	out, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return out
}

// accepted records a bearer token the API server accepted.
func (s *store) accepted(tokenHash, identity string, expires time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.credentials[tokenHash]; ok && c.Identity == identity {
		return
	}
	s.credentials[tokenHash] = credential{Identity: identity, Expires: expires}
	s.markDirty(bCredentials, tokenHash)
}

// credential is the identity of a token accepted before and not expired.
func (s *store) credential(tokenHash string, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.credentials[tokenHash]
	if !ok || (!c.Expires.IsZero() && now.After(c.Expires)) {
		return "", false
	}
	return c.Identity, true
}

func (s *store) keepDiscovery(key string, a rawAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.discovery[key]; ok && old.ContentType == a.ContentType && string(old.Body) == string(a.Body) {
		return
	}
	s.discovery[key] = a
	s.markDirty(bDiscovery, key)
}

func (s *store) discoveryAnswer(key string) (rawAnswer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.discovery[key]
	return a, ok
}

func (s *store) keepToken(key string, t tokenAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[key] = t
	s.markDirty(bTokens, key)
}

func (s *store) token(key string, now time.Time) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[key]
	if !ok || now.After(t.Expires) {
		return nil, false
	}
	return t.Body, true
}

// flush writes what changed since the last flush in one transaction.
func (s *store) flush() error {
	s.mu.Lock()
	type write struct {
		bucket, key []byte
		value       []byte // nil: delete
	}
	var writes []write
	for d := range s.dirty {
		bucket, key, _ := strings.Cut(d, "\x00")
		w := write{bucket: []byte(bucket), key: []byte(key)}
		switch bucket {
		case string(bObjects):
			ck, ok2, _ := splitObjectKey(key)
			if c := s.collections[ck]; c != nil {
				if raw, ok := c.objects[ok2]; ok {
					w.value = raw
					if sealed[collectionOf(ck)] {
						w.value = s.seal(raw)
					}
				}
			}
		case string(bCollections):
			if c := s.collections[key]; c != nil {
				w.value, _ = json.Marshal(c)
			}
		case string(bCredentials):
			if c, ok := s.credentials[key]; ok {
				w.value, _ = json.Marshal(c)
			}
		case string(bDiscovery):
			if a, ok := s.discovery[key]; ok {
				w.value, _ = json.Marshal(a)
			}
		case string(bTokens):
			if t, ok := s.tokens[key]; ok {
				raw, _ := json.Marshal(t)
				w.value = s.seal(raw)
			}
		}
		writes = append(writes, w)
	}
	clear(s.dirty)
	s.mu.Unlock()
	if len(writes) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, w := range writes {
			b := tx.Bucket(w.bucket)
			var err error
			if w.value == nil {
				err = b.Delete(w.key)
			} else {
				err = b.Put(w.key, w.value)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// offlineSince is when the API server was lost, kept across restarts of the
// proxy (a reboot while cut off does not restart the count); zero: online
// when last known.
func (s *store) offlineSince() time.Time {
	var t time.Time
	_ = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bMeta).Get(kOfflineSince); v != nil {
			_ = t.UnmarshalText(v)
		}
		return nil
	})
	return t
}

// setOfflineSince records (zero: clears) when the API server was lost.
func (s *store) setOfflineSince(t time.Time) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if t.IsZero() {
			return tx.Bucket(bMeta).Delete(kOfflineSince)
		}
		v, err := t.MarshalText()
		if err != nil {
			return err
		}
		return tx.Bucket(bMeta).Put(kOfflineSince, v)
	})
}

func (s *store) close() error {
	err := s.flush()
	return errors.Join(err, s.db.Close())
}

// selects says whether an object is in the request's scope: its namespace,
// label selector and field selector.
func (r apiRequest) selects(raw json.RawMessage) (bool, error) {
	var m objectMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return false, err
	}
	if r.namespace != "" && m.Metadata.Namespace != r.namespace {
		return false, nil
	}
	if r.labels != nil && !r.labels.Matches(labels.Set(m.Metadata.Labels)) {
		return false, nil
	}
	if r.fields == nil || r.fields.Empty() {
		return true, nil
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return false, err
	}
	return r.fields.Matches(jsonFields{obj}), nil
}

// jsonFields reads field selector paths (metadata.name, spec.nodeName,
// status.phase) from an object's JSON.
type jsonFields struct{ obj map[string]any }

var _ fields.Fields = jsonFields{}

func (f jsonFields) Has(field string) bool {
	_, ok := f.lookup(field)
	return ok
}

func (f jsonFields) Get(field string) string {
	v, _ := f.lookup(field)
	return v
}

func (f jsonFields) lookup(field string) (string, bool) {
	var cur any = f.obj
	for p := range strings.SplitSeq(field, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false
		}
		if cur, ok = m[p]; !ok {
			// An absent field reads as empty, as the API server's field
			// sets hold every selectable field.
			return "", true
		}
	}
	switch v := cur.(type) {
	case string:
		return v, true
	case bool, float64:
		return fmt.Sprint(v), true
	case nil:
		return "", true
	}
	return "", false
}
